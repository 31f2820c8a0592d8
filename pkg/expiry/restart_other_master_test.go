package expiry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/gateway"
)

// TestEmptyRestartOfAnotherMasterRestoresSilentUsers: in a Redis Cluster,
// the master holding some users' sessions restarts without its data,
// while the gateway's heartbeat lives on another master and nothing of
// the gateway's touches the restarted one (its users there are silent:
// connected, no ping since before the restart). No heartbeat finds the
// data lost and no renewal fails, so before the gateway watched the
// masters' run ids, it never resynced, and those users were never guided
// (the fault suite lost such silences at every "redis restart empty").
// Each must get exactly one guide, as must the silent users elsewhere.
func TestEmptyRestartOfAnotherMasterRestoresSilentUsers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		heartbeat time.Duration
		ttl       time.Duration
	}{
		// Seen within half a second: the grants still run, and are
		// written back as they were.
		{name: "seen before the deadlines", heartbeat: 500 * time.Millisecond, ttl: 3 * time.Second},
		// Seen at the gateway's first look after its start, 10 s in:
		// the grants ran out between the restart and then, and are
		// handed over as lapsed, from the master's start (its uptime).
		{name: "seen after the deadlines", heartbeat: 10 * time.Second, ttl: 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testEmptyRestartOfAnotherMaster(t, tc.heartbeat, tc.ttl)
		})
	}
}

func testEmptyRestartOfAnotherMaster(t *testing.T, heartbeat, ttl time.Duration) {
	h := newClusterHarness(t, false)
	ctx := context.Background()
	gw := h.startAttackGateway(h.cluster.Addrs()[0], ttl, func(c *gateway.Config) {
		c.Redis.Addrs, c.Redis.Cluster = h.cluster.Addrs(), true
		c.HeartbeatInterval = heartbeat
	})
	stop := h.start(h.config(ModeSweep))
	defer stop()

	owner := func(key string) int {
		t.Helper()
		slot, err := h.rdb.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		i, err := h.cluster.SlotOwner(ctx, int(slot))
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	ks := h.store.Keyspace()
	control := owner(ks.RunIDKey())
	victim := (control + 1) % len(h.cluster.Masters)
	// Silent users on the master that restarts, and some elsewhere.
	var on, off []string
	for i := 0; len(on) < 3 || len(off) < 2; i++ {
		uid := fmt.Sprintf("silent-%d", i)
		switch owner(ks.SessionKey(uid)) {
		case victim:
			if len(on) < 3 {
				on = append(on, uid)
			}
		case control:
			if len(off) < 2 {
				off = append(off, uid)
			}
		}
	}
	if owner(ks.AliveKey()) == victim {
		t.Fatalf("the heartbeat's key is on the master that restarts: the test would not show what it means to")
	}
	for _, uid := range append(append([]string{}, on...), off...) {
		startPinger(t, gw, uid, 0) // one ping, then connected and quiet
	}
	waitFor(t, waitLong, "every silent user's session", func() bool {
		for _, uid := range append(append([]string{}, on...), off...) {
			if !h.inIndex(uid) {
				return false
			}
		}
		return true
	})
	if err := h.cluster.Masters[victim].RestartEmpty(ctx); err != nil {
		t.Fatal(err)
	}
	// The cluster takes the node back once it has seen it again.
	waitFor(t, waitLong, "the restarted master serving its slots", func() bool {
		return h.rdb.Exists(ctx, ks.SessionKey(on[0])).Err() == nil
	})
	if n := h.rdb.Exists(ctx, ks.SessionKey(on[0])).Val(); n != 0 {
		t.Fatalf("%s's session outlived a restart without data", on[0])
	}
	all := append(append([]string{}, on...), off...)
	waitFor(t, 2*heartbeat+waitLong, "a guide for every silent user", func() bool {
		got := byUID(h.events())
		for _, uid := range all {
			if len(got[uid]) == 0 {
				return false
			}
		}
		return true
	})
	// A second guide would come by then.
	h.sweptPast(h.redisNow().Add(testGrace))
	stop()

	got := byUID(h.events())
	for _, uid := range all {
		if n := len(got[uid]); n != 1 {
			where := "elsewhere"
			if owner(ks.SessionKey(uid)) == victim {
				where = "on the master that restarted empty"
			}
			t.Errorf("%s (%s), silent since before the restart: %d guides, want 1", uid, where, n)
		}
	}
}
