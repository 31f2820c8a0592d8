// Review round 4. Package: pkg/expiry (file pkg/expiry/attack4_via_test.go).
// Run: go test -race -count=1 -run 'TestAttack4ShortDeviceOnCutInstanceForgotten' -v ./pkg/expiry/
// Shows: a renewal that keeps a longer deadline also keeps that grant's instance as the session's
// via, so the instance of the user's device that renewed last is named nowhere once another
// instance's route write has dropped it as dead: a user whose laptop pings all along, on an
// instance cut off from Redis, is guided when their phone's grant runs out.
// Seen failing (before the fix):
//   DEFECT: the user got 1 timeout event(s) (deadline ..., produced ... while the laptop's instance
//   was still cut off from Redis): the laptop pinged every 400ms throughout

package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// TestAttack4ShortDeviceOnCutInstanceForgotten: a user has a phone in a
// long-TTL segment on gateway A and a laptop in the default segment on
// gateway B, pinging every 400ms. The phone's grant is the deadline: the
// laptop's renewals keep it (a renewal never moves a live deadline
// earlier), and with it the via of the phone's grant, A. B's path to
// Redis is then cut: the laptop keeps pinging B, whose renewals fail, and
// B misses its heartbeats. The phone's connection drops; A writes the
// user's route, and drops B's entry from it, B being dead by its
// heartbeats. Now neither the via (A, alive) nor the route names B, and
// the hold rules ("every gateway instance of the user counts: the one
// that renewed last, and every one holding a connection of theirs") look
// at nothing that was cut: the phone's deadline, which falls in B's cut,
// well within the grace after B's last heartbeat, is guided while the
// laptop is pinging. Before the max rule, the laptop's renewal made B the
// via, and the deadline was held.
func TestAttack4ShortDeviceOnCutInstanceForgotten(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const phoneTTL = 6 * time.Second
	h.savePolicy(policy.Policy{
		DefaultTTL: 2 * time.Second,
		Segments:   map[string]time.Duration{"mobile": phoneTTL},
	})
	cfg := h.config(ModeSweep)
	// More than from the cut to the phone's deadline: a deadline that
	// falls in B's cut is held until the grace after B's last heartbeat,
	// by which B is back and has restored the laptop's renewals.
	cfg.OutageGrace = 10 * time.Second
	h.start(cfg)
	proxy, err := tcpproxy.Start(h.srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	gwA := h.startAttackGateway(h.srv.Addr, 2*time.Second, func(c *gateway.Config) { c.InstanceID = "gw-a" })
	gwB := h.startAttackGateway(proxy.Addr(), 2*time.Second, func(c *gateway.Config) { c.InstanceID = "gw-b" })

	const uid = "two-segments"
	phone := dialSegment(t, gwA, uid, "mobile")
	waitGranted(t, phone, phoneTTL-time.Second) // the mobile segment's
	laptop := startPinger(t, gwB, uid, 400*time.Millisecond)
	ks := h.store.Keyspace()
	ctx := context.Background()
	waitFor(t, waitLong, "the laptop's route entry", func() bool {
		n, err := h.rdb.HLen(ctx, ks.RouteKey(uid)).Result()
		return err == nil && n == 2
	})
	// A few of the laptop's renewals, each keeping the phone's deadline.
	waitPongs(t, laptop.pongs.Load()+2, laptop)

	proxy.Cut()
	cutAt := h.redisNow()
	// B misses its heartbeats (a lease of 300ms), then the phone drops:
	// A writes the user's route with B dead. B's lease runs out by
	// Redis's clock, and A must have seen it: A reads the heartbeats
	// after each of its own, so two beats of A after B's lease ran out
	// mean A's view was read after it. (A's estimate of Redis's clock
	// from an older view lags by the reply's time in a busy process, and
	// keeping B's entry is then the safe side, but not this test's case.)
	instances := func() map[string]session.Instance {
		_, insts, err := h.store.Instances(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return insts
	}
	var bEnd, aBeat time.Time
	waitFor(t, waitLong, "B's lease to run out", func() bool {
		now, insts, err := h.store.Instances(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, ok := insts["gw-b"]
		bEnd = b.Last.Add(b.Lease)
		return ok && !b.AliveAt(now)
	})
	waitFor(t, waitLong, "a beat of A after B's lease ran out", func() bool {
		aBeat = instances()["gw-a"].Last
		return aBeat.After(bEnd)
	})
	waitFor(t, waitLong, "A's next beat, after its view was read", func() bool {
		return instances()["gw-a"].Last.After(aBeat)
	})
	phone.Close()
	waitFor(t, waitLong, "A's route write to drop B's entry", func() bool {
		n, err := h.rdb.HLen(ctx, ks.RouteKey(uid)).Result()
		return err == nil && n == 0
	})
	var deadline time.Time
	if ms, err := h.rdb.ZScore(ctx, ks.IndexKey(session.Bucket(uid)), uid).Result(); err == nil {
		deadline = time.UnixMilli(int64(ms))
	}
	// Real time must pass: past the phone's deadline, with B still cut.
	waitFor(t, waitLong, "the phone's deadline to pass", func() bool { return h.redisNow().After(deadline.Add(500 * time.Millisecond)) })
	proxy.Restore()
	restoredAt := h.redisNow()
	// Past the grace after the cut began: a held deadline is checked
	// again by then, and the laptop, pinging through B again, is there.
	waitFor(t, waitLong, "the grace after the cut", func() bool { return h.redisNow().After(cutAt.Add(cfg.OutageGrace + time.Second)) })
	laptop.stop()

	if evs := byUID(h.events())[uid]; len(evs) > 0 {
		t.Fatalf("DEFECT: the user got %d timeout event(s) (deadline %s, produced %v before the laptop's instance reached Redis again): "+
			"the laptop pinged every 400ms throughout, on an instance cut off from Redis, which neither the via (the phone's instance) "+
			"nor the route (dropped as dead by the phone's instance) named any more",
			len(evs), time.UnixMilli(evs[0].DeadlineMS).Format("15:04:05.000"),
			restoredAt.Sub(time.UnixMilli(evs[0].DetectedMS)).Round(time.Millisecond))
	}
}
