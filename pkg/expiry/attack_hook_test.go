package expiry

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/outage"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// The attack round on the listener's own stall (stall.go): every round
// trip of its Redis client is timed, and the round trips that stalled are
// placed, by Redis's clock, at the next mark whose own round trip was
// quick, and merged into the last stall placed when they overlap it.

// TestAttackFlappingLinkHoldsUntilItHeals: one listener's network path to
// Redis flaps, as a lossy link does (TCP retransmissions back off): 0.8 s
// stalled, 0.2 s through, again and again for 8 s. Users reach Redis all
// along; nobody's ping is held up. Each stall is this replica's own and
// holds the timeouts that fell due in it stallSettle after it. But each
// is placed from stallMin before its first round trip, so it overlaps the
// one before and is merged into it (placeStalls): the interval grows for
// as long as the link flaps, and a silent user whose deadline fell in the
// first stall is held again at every release, until the link heals and
// stallSettle more. A link that keeps flapping holds them for ever.
func TestAttackFlappingLinkHoldsUntilItHeals(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	p := h.startStallProxy(h.srv.Addr)
	cfg := h.config(ModeSweep)
	cfg.Redis.Addrs = []string{p.addr()}
	// The link's stalls are shorter than the gap that would be recorded
	// for everyone: only the stall rule sees them.
	cfg.SweepGapMax = DefaultConfig().SweepGapMax
	stop := h.start(cfg)
	defer stop()
	h.sweptPast(h.redisNow())

	const (
		stalled = 800 * time.Millisecond
		through = 200 * time.Millisecond
		flaps   = 8
	)
	g := h.renew("silent", "default", 300*time.Millisecond)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range flaps {
			p.stall()
			// Real time must pass for the link to stay stalled, and then
			// through.
			time.Sleep(stalled)
			p.resume()
			time.Sleep(through)
		}
	}()
	defer wg.Wait()

	h.waitProduced(1)
	evs := h.events()
	checkExactlyOnce(t, evs, map[string]grant{"silent": g}, timeoutevent.SourceSweep)
	// The first stall ends at most one stall after the deadline; its own
	// wait is stallSettle; a second more for a busy host.
	limit := stalled + stallSettle + time.Second
	for _, ev := range evs {
		if late := time.Duration(ev.DetectedMS-ev.DeadlineMS) * time.Millisecond; late > limit {
			var blind []string
			for _, b := range h.blindList(context.Background()) {
				blind = append(blind, fmt.Sprintf("%s %s..%s", b.Reason, b.Start.Format("15:04:05.000"), b.End.Format("15:04:05.000")))
			}
			t.Errorf("silent guided %v after its deadline, past its stall's own wait (limit %v): the link flapped for %v (blind intervals recorded: %q)",
				late, limit, flaps*(stalled+through), blind)
		}
	}
}

// TestAttackStallLeaksIntoCurrent: this replica's own stall is for its
// own judgements only, "not in the state other callers read (current)"
// (markVia). But the mark stores a pointer to its control state before it
// appends the stall to that same state's blind intervals: the state
// current returns holds the stall as well, and the append is a write to
// what other goroutines read through current without a lock (the read
// ahead's and othersAlive's reads race with markLoop's marks; run with
// -race).
func TestAttackStallLeaksIntoCurrent(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeSweep)
	m := &marker{
		store: h.store, rdb: h.rdb, cfg: cfg, id: "stalled", log: testLogger(),
		down:  outage.NewLog(testLogger(), "read the control state from Redis", 0),
		fleet: outage.NewLog(testLogger(), "gateway fleet", 0),
	}
	m.pingOK.Store(true)
	ctx := context.Background()
	if _, err := m.mark(ctx); err != nil {
		t.Fatal(err)
	}
	// A stall this replica noted and placed a moment ago.
	now := h.redisNow()
	m.mu.Lock()
	m.stalls = []session.BlindInterval{{Start: now.Add(-2 * time.Second), End: now, Reason: session.BlindReadStall}}
	m.mu.Unlock()

	// Another goroutine reads the current state while marks go on, as
	// the pipeline's read ahead does beside markLoop.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if c, ok := m.current(); ok {
				_ = len(c.Blind)
			}
		}
	}()
	var own session.Control
	for range 20 {
		c, err := m.mark(ctx)
		if err != nil {
			t.Fatal(err)
		}
		own = c
	}
	close(done)
	wg.Wait()

	if !slices.ContainsFunc(own.Blind, func(b session.BlindInterval) bool { return b.Reason == session.BlindReadStall }) {
		t.Fatalf("the mark's own state lacks the stall: %+v", own.Blind)
	}
	cur, _ := m.current()
	for _, b := range cur.Blind {
		if b.Reason == session.BlindReadStall {
			t.Errorf("the state other callers read holds this replica's own stall %s..%s",
				b.Start.Format("15:04:05.000"), b.End.Format("15:04:05.000"))
		}
	}
}
