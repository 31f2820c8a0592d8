// Review round 4. Package: pkg/session (file pkg/session/attack4_upgrade_test.go).
// Run: go test -race -count=1 -run 'TestAttack4RollingUpgradeTakenForFailover' -v ./pkg/session/
// Shows: the sweep mark now stores the cluster's roles in the key where the previous release
// stored its epoch, and that release records a failover whenever the value differs from its own:
// while listener replicas of both releases run (every rolling upgrade with two or more replicas),
// each mark of the old one records a failover, a blind interval of everyone, and every deadline
// due meanwhile waits the whole grace.
// Seen failing (before the fix):
//   DEFECT: 3 of 3 marks of the previous release recorded a failover on a cluster where no node
//   failed

package session

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// previousMarkScript is the sweep mark of the previous release, as it
// runs in a listener replica not yet upgraded: its source as that release
// shipped it.
var previousMarkScript = redis.NewScript(mustReadFile("testdata/previous_mark.lua"))

// TestAttack4RollingUpgradeTakenForFailover: listener replicas are
// upgraded one at a time, so for a while replicas of the previous release
// and of this one mark the same control keys, on the same cluster, where
// nothing fails. Neither may record a failover: it is a blind interval
// of everyone, and every timeout due in it and the grace after (75s in
// production) waits for that grace.
func TestAttack4RollingUpgradeTakenForFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster")
	}
	t.Parallel()
	s, ctx := newClusterStore(t)
	keys := []string{s.ks.SweptKey(), s.ks.BlindKey(), s.ks.AliveKey(), s.ks.ListenersKey(), s.ks.RunIDKey()}
	previous := func() string {
		t.Helper()
		vals, err := previousMarkScript.Run(ctx, s.rdb, keys, time.Hour.Milliseconds(), 0, time.Hour.Milliseconds(), "old", 0).Slice()
		if err != nil {
			t.Fatal(err)
		}
		reason, _ := vals[2].(string)
		return reason
	}
	current := func() string {
		t.Helper()
		c, err := s.Mark(ctx, SweepMark{GapMax: time.Hour, Keep: time.Hour, Listener: "new"})
		if err != nil {
			t.Fatal(err)
		}
		if c.Gap != nil {
			return c.Gap.Reason
		}
		return ""
	}
	previous() // the fleet before the upgrade
	failovers, marks := 0, 0
	for range 3 {
		if r := current(); r != "" {
			t.Errorf("a mark of this release recorded %q on a cluster where no node failed", r)
		}
		marks++
		if r := previous(); r == BlindFailover {
			failovers++
		} else if r != "" {
			t.Errorf("a mark of the previous release recorded %q", r)
		}
	}
	if failovers > 0 {
		t.Fatalf("DEFECT: %d of %d marks of the previous release recorded a failover on a cluster where no node failed: "+
			"each is a blind interval of everyone, and every deadline due during the rolling upgrade waits the whole grace", failovers, marks)
	}
}
