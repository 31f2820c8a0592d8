package expiry

import (
	"fmt"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// TestReplicasAlive: the replicas that take work are the others that
// marked within the freshness and could produce then.
func TestReplicasAlive(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	const fresh = 2 * time.Second
	c := session.Control{Now: now, Listeners: map[string]session.Listener{
		"me":      {At: now},
		"b":       {At: now.Add(-time.Second)},
		"a":       {At: now.Add(-fresh)},
		"stale":   {At: now.Add(-fresh - time.Millisecond)},
		"failing": {At: now, Failing: true},
	}}
	got := replicasAlive("me", c, fresh)
	if fmt.Sprint(got) != "[a b]" {
		t.Fatalf("replicasAlive = %v, want [a b]", got)
	}
}

// TestOwnedBuckets: every bucket has exactly one owner among the replicas
// that take work, each a fair share; a replica that joins takes buckets
// only from the others, one that leaves hands only its own on; a replica
// that cannot produce owns none while another takes work, and all when
// none does.
func TestOwnedBuckets(t *testing.T) {
	split := func(ids []string) map[int]string {
		owner := map[int]string{}
		for i, id := range ids {
			others := append(append([]string{}, ids[:i]...), ids[i+1:]...)
			owned := ownedBuckets(id, true, others)
			for b, ok := range owned {
				if !ok {
					continue
				}
				if prev, dup := owner[b]; dup {
					t.Fatalf("%v: bucket %d owned by %s and %s", ids, b, prev, id)
				}
				owner[b] = id
			}
		}
		if len(owner) != session.Buckets {
			t.Fatalf("%v: %d of %d buckets owned", ids, len(owner), session.Buckets)
		}
		return owner
	}
	tests := []struct {
		name     string
		ids      []string
		minShare int // fewest buckets any one replica may own
	}{
		{"one replica owns all", []string{"a1b2c3d4e5f60718"}, session.Buckets},
		{"two share", []string{"a1b2c3d4e5f60718", "0f1e2d3c4b5a6978"}, 20},
		{"three share", []string{"a1b2c3d4e5f60718", "0f1e2d3c4b5a6978", "5555aaaa5555aaaa"}, 12},
		{"ids that differ in one character", []string{"replica-1", "replica-2", "replica-3", "replica-4"}, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			count := map[string]int{}
			for _, id := range split(tt.ids) {
				count[id]++
			}
			for _, id := range tt.ids {
				if count[id] < tt.minShare {
					t.Errorf("%s owns %d buckets, want at least %d: %v", id, count[id], tt.minShare, count)
				}
			}
		})
	}
	t.Run("join and leave move only the newcomer's share", func(t *testing.T) {
		before := split([]string{"r1", "r2", "r3"})
		after := split([]string{"r1", "r2", "r3", "r4"})
		for b, was := range before {
			if now := after[b]; now != was && now != "r4" {
				t.Errorf("bucket %d moved from %s to %s when r4 joined", b, was, now)
			}
		}
		// r4 leaves again: the split is what it was.
		if again := split([]string{"r1", "r2", "r3"}); fmt.Sprint(again) != fmt.Sprint(before) {
			t.Errorf("after r4 left the split differs from before it joined")
		}
	})
	t.Run("a replica that cannot produce", func(t *testing.T) {
		if owned := ownedBuckets("me", false, []string{"other"}); owned != ([session.Buckets]bool{}) {
			t.Errorf("standby replica owns buckets: %v", owned)
		}
		all := ownedBuckets("me", false, nil)
		for b, ok := range all {
			if !ok {
				t.Fatalf("a replica alone that cannot produce does not own bucket %d", b)
			}
		}
	})
}
