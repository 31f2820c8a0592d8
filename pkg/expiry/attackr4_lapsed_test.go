package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttackR4LapsedRestoreHeldForTheOtherDevice: a grant that ran out in
// an outage is restored at its own deadline, in the past, and the
// gateway's doc says the listener holds it until the grace is over. That
// hold is what keeps a user's other device safe: its gateway, cut off
// too, resyncs its live grant only once it is back, and the first
// gateway's restore must not be guided before then. Before the fix the
// restore was due just past now, inside the blind interval of the data
// loss. At its own deadline it may fall before every blind interval:
//
//   - both gateways are cut off from Redis (their clients stay
//     connected); device 1 on gateway A is silent, and its grant runs out
//     in the cut; device 2 on gateway B pings all along, its renewals
//     failing;
//   - Redis restarts empty while they are cut off: the listener, which
//     kept marking until then, records the data loss from its last mark,
//     after device 1's deadline; the heartbeats and routes of A and B
//     are gone with the data;
//   - A is back first: its heartbeat finds the data lost, and its resync
//     restores device 1's lapsed grant at its deadline. No renewal of A
//     failed (device 1 was silent), so A records no outage of its own;
//     the record of the heartbeat gap went with the data; B, still cut
//     off, is no instance of the user any more (its route and its
//     heartbeat were lost). Nothing holds the deadline: the user is
//     guided at once, while device 2 pings.
func TestAttackR4LapsedRestoreHeldForTheOtherDevice(t *testing.T) {
	h := newHarness(t)
	const ttl = 2 * time.Second
	pa, pb := h.redisProxy(), h.redisProxy()
	gwA := h.startAttackGateway(pa.Addr(), ttl, nil)
	gwB := h.startAttackGateway(pb.Addr(), ttl, nil)
	stop := h.start(h.config(ModeSweep))
	defer stop()

	const uid = "two-devices"
	silent := startPinger(t, gwA, uid, 0)
	waitPongs(t, 1, silent)
	d1 := time.Now().Add(ttl) // device 1's deadline, a moment late
	pinging := startPinger(t, gwB, uid, ttl/5)
	waitPongs(t, 2, pinging)

	pa.Cut()
	pb.Cut()
	// Real time must pass: device 1's grant runs out in the cut, and the
	// listener marks a sweep after it.
	h.untilRedis(d1.Add(500 * time.Millisecond))
	ctx := context.Background()
	if err := h.rdb.FlushAll(ctx).Err(); err != nil { // Redis restarted empty
		t.Fatal(err)
	}
	blind := h.store.Keyspace().BlindKey()
	waitFor(t, waitLong, "the listener to record the data loss", func() bool {
		n, err := h.rdb.ZCard(ctx, blind).Result()
		return err == nil && n > 0
	})

	pa.Restore()
	// The restore is in the index until the listener holds it (the hold
	// set), which may be before this looks: on a busy host it was found
	// only once the hold released it, past the grace, and the guide then
	// was taken for one within it.
	waitFor(t, waitLong, "gateway A's resync to restore device 1's lapsed grant", func() bool { return h.inIndex(uid) || h.inHold(uid) })
	restored := time.Now()
	// Well inside the grace (3 s), before B is back: the hold must keep
	// the user's timeout.
	if eventually(testGrace/2, func() bool { return len(byUID(h.events())[uid]) > 0 }) {
		t.Errorf("guided %v after gateway A's resync restored device 1's lapsed grant, within the grace and while device 2 pinged gateway B (still cut off): a guide to someone still there",
			time.Since(restored).Round(10*time.Millisecond))
	}

	pb.Restore()
	waitFor(t, waitLong, "gateway B's resync to restore device 2's grant", func() bool {
		v, err := h.rdb.ZScore(ctx, h.store.Keyspace().IndexKey(session.Bucket(uid)), uid).Result()
		return err == nil && time.UnixMilli(int64(v)).After(h.redisNow())
	})
	h.sweptPast(h.redisNow().Add(testGrace))
	if n := len(byUID(h.events())[uid]); n != 0 {
		t.Errorf("%d guides for a user whose second device pinged all along, want none", n)
	}
}
