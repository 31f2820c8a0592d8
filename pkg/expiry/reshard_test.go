package expiry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestClusterReshardWhileLive moves the slot of one bucket to another
// Redis Cluster master while its users ping through a gateway and others
// go silent, slowly enough that renewals, sweeps and event lookups meet
// the slot mid-migration: keys split between the two masters, answered
// with ASK and TRYAGAIN. No pinging user's timeout is produced, and every
// silent user's is, exactly once, in the moving bucket and elsewhere.
//
// A quick move (about a quarter second, as redis-cli moves a slot of a
// few thousand keys) is ridden out by the renewals' retries: every ping
// is answered with a pong. A slow one outlasts them and the deadlines of
// the moving bucket's pingers lapse under it; the gateway records the
// outage while it lasts, so the listener, which meets those deadlines the
// moment the slot is back, holds them until the resynced sessions are
// back too.
func TestClusterReshardWhileLive(t *testing.T) {
	if testing.Short() {
		t.Skip("Redis Cluster resharding")
	}
	t.Parallel()
	for _, tc := range []struct {
		name  string
		mode  string
		batch int
		pause time.Duration
		// quick: the move ends within the renewals' retries, so no ping
		// may fail.
		quick bool
		// silentMoving: some users of the moving bucket go silent; else
		// every one of them pings, and none of their deadlines makes the
		// sweep fail before theirs lapse.
		silentMoving bool
	}{
		{"quick, sweep", ModeSweep, 2, 15 * time.Millisecond, true, true},
		{"quick, hybrid", ModeHybrid, 2, 15 * time.Millisecond, true, true},
		{"slow, every user of the bucket pinging", ModeSweep, 1, 100 * time.Millisecond, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newClusterHarness(t, false)
			ks := h.store.Keyspace()
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
			defer cancel()
			// A bucket away from the control keys, so that only sessions
			// move, to the third master.
			ctlMaster := h.masterOf(ks.AliveKey())
			bucket := -1
			for b := range session.Buckets {
				if h.masterOf(ks.IndexKey(b)) != ctlMaster {
					bucket = b
					break
				}
			}
			from := h.masterOf(ks.IndexKey(bucket))
			to := 3 - from - ctlMaster
			slot, err := h.cluster.SlotOf(ctx, ks.IndexKey(bucket))
			if err != nil {
				t.Fatal(err)
			}
			var moving, others []string
			for i := 0; len(moving) < 8 || len(others) < 4; i++ {
				uid := fmt.Sprintf("rs-%d", i)
				switch {
				case session.Bucket(uid) == bucket && len(moving) < 8:
					moving = append(moving, uid)
				case session.Bucket(uid) != bucket && len(others) < 4:
					others = append(others, uid)
				}
			}
			pinging, silent := append(moving[:4:4], others[:2]...), append(moving[4:8:8], others[2:]...)
			if !tc.silentMoving {
				pinging, silent = append(moving[:8:8], others[:2]...), others[2:]
			}

			const ttl = 2 * time.Second
			gw := h.startAttackGateway(h.cluster.Addrs()[0], ttl, func(c *gateway.Config) {
				c.Redis.Addrs, c.Redis.Cluster = h.cluster.Addrs(), true
				// The production interval: a gateway sends refused
				// renewals again for 3/4 of it (at most 750 ms), inside
				// the time a hanging round trip may take before it counts
				// as an outage.
				c.HeartbeatInterval = time.Second
			})
			cfg := h.config(tc.mode)
			stop := h.start(cfg)
			defer stop()
			if tc.mode != ModeSweep {
				h.waitSubscribed(1)
			}
			period := ttl / 4
			var active []*pinger
			for _, uid := range pinging {
				active = append(active, startPinger(t, gw, uid, period))
			}
			for _, uid := range silent {
				startPinger(t, gw, uid, 0)
			}
			started := time.Now()
			// The silent users' deadlines, and the pings at 4 periods,
			// fall while the slot moves. Real time must pass: the
			// pingers' own clocks set when that is.
			time.Sleep(time.Until(started.Add(ttl - 150*time.Millisecond)))
			begun := time.Now()
			if err := h.cluster.MigrateSlot(ctx, slot, to, tc.batch, tc.pause); err != nil {
				t.Fatal(err)
			}
			took := time.Since(begun)
			t.Logf("slot %d of bucket %d moved from master %d to %d in %v", slot, bucket, from, to, took)
			if owner := h.masterOf(ks.IndexKey(bucket)); owner != to {
				t.Fatalf("bucket %d on master %d after the move, want %d", bucket, owner, to)
			}
			if !tc.quick && took < ttl-period {
				t.Fatalf("the slow move took %v: no deadline lapsed under it (want over %v)", took, ttl-period)
			}

			// Every deadline the move could touch has passed, held or
			// not, and a sweep after it.
			h.sweptPast(h.redisNow().Add(ttl + cfg.OutageGrace))
			for _, p := range active {
				p.stop()
			}
			stop()
			got := byUID(h.events())
			for _, p := range active {
				if evs := got[p.uid]; len(evs) > 0 {
					t.Errorf("%s pinged every %v throughout (%d pongs, %d errors), yet got %d timeout event(s), deadline %v",
						p.uid, period, p.pongs.Load(), p.errs.Load(), len(evs), time.UnixMilli(evs[0].DeadlineMS).Format("15:04:05.000"))
				}
				// Renewals are sent again for up to 750ms: a move shorter
				// than that, less the longest pause, fails none.
				if n := p.errs.Load(); tc.quick && n > 0 && took < 600*time.Millisecond {
					t.Errorf("%s: %d ping(s) answered with an error while the slot moved in %v, want each renewal retried until it landed", p.uid, n, took)
				}
			}
			for _, uid := range silent {
				if n := len(got[uid]); n != 1 {
					t.Errorf("silent user %s (bucket %d): %d timeout events, want 1", uid, session.Bucket(uid), n)
				}
			}
		})
	}
}
