package expiry

import (
	"context"
	"slices"
	"testing"
	"time"
)

// Attack tests, fourth round, of the brake's count of lapses: a count the
// client saw fail that Redis ran all the same, and lapses a failed count
// carries that no later count can place.

// accepted is how many connections the proxy has taken.
func (p *stallProxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) / 2
}

// TestAttackCountRetriedCountsTwice: Redis is slow to answer one count of
// lapses (a stall: the crowd's own big round trips, a slow command, TCP
// retransmissions backing off on a lossy path). The script ran, or runs
// once its request arrives; the client gives up waiting for the reply
// (its read timeout), and its retry runs the script again on a new
// connection: the count's INCRBY is not idempotent, and the lapses are
// counted twice. Here a crowd of 30, below the threshold of 50, is
// counted as 60: the brake engages for a crowd that never was, and every
// lapse and later stage of the window after is held for the grace.
func TestAttackCountRetriedCountsTwice(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l, p := h.idleBehindStallProxy(0)
	ctx := context.Background()

	found := h.redisNow()
	before := p.accepted()
	p.stall()
	res := make(chan bool, 1)
	go func() { res <- l.braking(ctx, found, slices.Repeat([]time.Time{found}, 30)) }()
	// The reply does not come; once the client gives up on it and dials
	// again to retry, the path is back.
	waitFor(t, waitLong, "the client to retry the count on a new connection", func() bool { return p.accepted() > before })
	p.resume()
	var held bool
	select {
	case held = <-res:
	case <-time.After(waitLong):
		t.Fatal("the count did not return")
	}
	// Whatever the count returned, Redis's counter is what every later
	// count sums: the first try's request lands once the path is back,
	// and the retry's with it, if it ran too.
	waitFor(t, waitLong, "the count to land", func() bool { return h.lapsesCounted(found, found) >= 30 })
	if !eventually(time.Second, func() bool { return h.lapsesCounted(found, found) > 30 }) {
		return
	}
	counted := h.lapsesCounted(found, found)
	t.Errorf("a crowd of 30 lapses, found in one second, is counted %d there (the count retried after a slow reply ran twice); the threshold is %d: braking said %v, engaged %v",
		counted, l.cfg.MassExpiryFloor, held, l.brake.engaged)
	if one := h.redisNow(); l.braking(ctx, one, []time.Time{one}) {
		t.Errorf("one ordinary lapse right after is held: the brake is engaged for the 30 counted twice")
	}
}

// TestAttackTimedOutCountCarriedTwice: as above, but the path stays down
// past every retry, so the count fails (braking holds the crowd, as it
// should) and the 30 are carried in brake.uncounted; the request of the
// first try still reaches Redis once the path comes back, and the script
// counts the 30 then. The next count that works adds the carried 30 again:
// 60, over the threshold of 50, for a crowd of 30 and one ordinary silence.
// A failed count's reply says nothing of whether the script ran.
// The window is a minute here only so that the carry outlives the four
// tries of the count (each waits out the client's read timeout); at the
// default 10 s a Redis that answers the retry does the same, above.
func TestAttackTimedOutCountCarriedTwice(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l, p := h.idleBehindStallProxy(time.Minute)
	ctx := context.Background()

	found := h.redisNow()
	p.stall()
	if !l.braking(ctx, found, slices.Repeat([]time.Time{found}, 30)) {
		t.Fatal("a count that failed did not hold its lapses")
	}
	if !l.brake.countFailing {
		t.Fatal("the count did not fail")
	}
	p.resume()
	waitFor(t, waitLong, "the first try's count to land in Redis", func() bool { return h.lapsesCounted(found, found) >= 30 })

	one := h.redisNow()
	held := l.braking(ctx, one, []time.Time{one})
	counted := h.lapsesCounted(found.Add(-l.cfg.MassExpiryWindow), h.redisNow().Add(time.Second))
	if held || l.brake.engaged || counted != 31 {
		t.Errorf("after a crowd of 30 whose count timed out and one ordinary lapse, the window counts %d lapses (want 31; threshold %d) and the lapse is held: %v, engaged %v: the 30 Redis counted were carried and counted again",
			counted, l.cfg.MassExpiryFloor, held, l.brake.engaged)
	}
}

// TestAttackUncountedPastLapseAheadHoldsForTheWindow: the window may be up
// to 10 minutes (Validate); a count is refused more than lapseAhead (2
// minutes) after the second its lapses were found in, yet a failed
// count's lapses are carried until they are a window old. With a window
// of 5 minutes, lapses a count failed on (a blip of Redis) can no longer
// be counted once 2 minutes old, and are still carried: every count after
// fails on them, and braking holds every lapse and later stage it is
// asked about, for the grace, for 3 minutes after the blip. Here the
// replica carries 5 lapses a count failed on 125 s ago (the state
// braking leaves), and one ordinary silence lapses.
func TestAttackUncountedPastLapseAheadHoldsForTheWindow(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.brakeConfig(ModeSweep)
	cfg.PrefetchInterval = 0
	cfg.MassExpiryWindow = 5 * time.Minute
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	l := h.openIdle(cfg)
	ctx := context.Background()

	cur := h.redisNow()
	blip := cur.Add(-125 * time.Second)
	// What braking leaves after a count of 5 lapses found at blip failed.
	l.brake.uncounted = []lapseCount{{sec: blip.Unix(), n: 5, token: "blip"}}
	l.brake.countFailing = true

	for i := range 3 {
		now := h.redisNow()
		if l.braking(ctx, now, []time.Time{now}) {
			t.Fatalf("count %d: one ordinary lapse %v after 5 uncounted ones is held for the grace (count failing: %v, carried %v): the carried lapses can no longer be counted (refused past %ds), yet are kept for the window of %v",
				i, now.Sub(blip).Round(time.Second), l.brake.countFailing, l.brake.uncounted, 120, cfg.MassExpiryWindow)
		}
	}
}

// idleBehindStallProxy opens an idle listener in sweep mode (the brake
// at a threshold of 50; its window, unless 0) whose Redis is reached
// through a stall proxy, and caches the count's script in Redis with a
// count of nothing.
func (h *harness) idleBehindStallProxy(window time.Duration) (*Listener, *stallProxy) {
	h.t.Helper()
	p := h.startStallProxy(h.srv.Addr)
	cfg := h.brakeConfig(ModeSweep)
	cfg.PrefetchInterval = 0
	if window > 0 {
		cfg.MassExpiryWindow = window
	}
	cfg.Redis.Addrs = []string{p.addr()}
	l := h.openIdle(cfg)
	if l.braking(context.Background(), h.redisNow(), nil) {
		h.t.Fatal("the brake held with nothing counted")
	}
	return l, p
}
