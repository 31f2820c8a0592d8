package expiry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestReadStallHolds: a Redis Cluster master that does not hold the
// control keys holds its writes (CLIENT PAUSE WRITE, as in a graceful
// failover) for longer than the sweep gap allowed. The listener's
// read of the deadlines hangs on it, while the marks between reads (the
// mark loop's, on the {ctl} master) say the sweeps run: no sweep gap. A
// user's ping to that master hung as long. When the master answers, the
// read finds the user's deadline passed; the ping lands just after. The
// read that stalled is a blind interval (read-stall): the timeout waits
// for the grace and is checked again, and the user who pinged is not
// produced. A user who stayed silent is, once.
//
// It is the hour run's ws-000: a guide for a deadline that fell while
// every renewal hung, produced before the gateways' records of it landed.
func TestReadStallHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster pause")
	}
	t.Parallel()
	for _, tc := range []struct {
		name     string
		prefetch bool
	}{
		{"sweep", false},
		{"prefetch", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newClusterHarness(t, false)
			ks := h.store.Keyspace()
			ctlMaster := h.masterOf(ks.AliveKey())
			victim := (ctlMaster + 1) % len(h.cluster.Masters)
			var uids []string // back, silent: both on the victim
			for i := 0; len(uids) < 2; i++ {
				uid := fmt.Sprintf("u-%d", i)
				if h.masterOf(ks.IndexKey(session.Bucket(uid))) == victim && h.masterOf(ks.SessionKey(uid)) == victim {
					uids = append(uids, uid)
				}
			}
			back, silent := uids[0], uids[1]
			cfg := h.config(ModeHybrid)
			if !tc.prefetch {
				cfg.Mode, cfg.PrefetchInterval = ModeSweep, 0
			}
			stop := h.start(cfg)
			defer stop()
			h.sweptPast(h.redisNow())

			const ttl = 1200 * time.Millisecond
			h.renew(back, "default", ttl)
			deadline := h.renew(silent, "default", ttl).deadline
			h.untilRedis(deadline.Add(-400 * time.Millisecond))
			// What a graceful failover does on the master it demotes:
			// writes wait, reads go on. The listener's reads of the
			// deadlines run scripts, which wait; the mark loop's look at
			// the masters (INFO) does not.
			victimClient := redis.NewClient(&redis.Options{Addr: h.cluster.Masters[victim].Addr})
			defer victimClient.Close()
			const pause = 1600 * time.Millisecond // past the sweep gap (1 s)
			if err := victimClient.Do(context.Background(), "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, waitLong, "the timeouts to be held, or produced", func() bool {
				held := h.heldUIDs()
				return held[back] && held[silent] || h.produced() > 0
			})
			if n := h.produced(); n != 0 {
				t.Fatalf("%d events produced right after a read of the deadlines stalled %v", n, pause)
			}
			// The user's ping, sent during the stall, lands.
			h.renew(back, "default", time.Minute)
			h.waitProduced(1)
			h.sweptPast(h.redisNow())
			stop()
			evs := h.events()
			checkExactlyOnce(t, evs, map[string]grant{silent: {segment: "default", deadline: deadline}}, timeoutevent.SourceSweep)
			if !h.blindRecorded(session.BlindReadStall) {
				t.Errorf("no %s blind interval recorded", session.BlindReadStall)
			}
		})
	}
}

// blindRecorded reports whether a blind interval for reason is recorded.
func (h *harness) blindRecorded(reason string) bool {
	h.t.Helper()
	c, err := h.store.Mark(context.Background(), session.SweepMark{GapMax: time.Hour, Keep: time.Hour, Listener: "probe"})
	if err != nil {
		h.t.Fatal(err)
	}
	for _, b := range c.Blind {
		if b.Reason == reason {
			return true
		}
	}
	return false
}
