package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// waitSecondOfMinute waits until Redis's clock is between from and to
// seconds into a minute, so that a test's deadlines share a window, and
// returns that minute window's end.
func (h *harness) waitSecondOfMinute(from, to int) time.Time {
	h.t.Helper()
	var now time.Time
	waitFor(h.t, time.Minute+waitLong, "Redis's clock to reach its second of the minute", func() bool {
		now = h.redisNow()
		s := now.Second()
		return s >= from && s < to
	})
	return session.DedupWindowEnd(now)
}

// TestSecondSilenceAfterStaleGuide: a user's first silence was guided
// stale (they came back); they go silent again in the same minute window.
// The second silence gets its own event at once, not the first's dedup.
func TestSecondSilenceAfterStaleGuide(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stop := h.start(h.config(ModeSweep))
	defer stop()
	windowEnd := h.waitSecondOfMinute(0, 40)
	first := h.renew("user", "default", 300*time.Millisecond)
	h.waitProduced(1)
	// The consumer found it stale: the user came back, then fell silent.
	// It marks what the listener marked produced; a consumer faster than
	// that mark loses its stale mark (MarkStale), and the second silence
	// waits for the window's end, which is not this test's case.
	dd := h.store.Keyspace().StageDedupKey("user", 1, first.deadline)
	waitFor(t, waitLong, "the listener to mark the first timeout produced", func() bool {
		return h.rdb.Get(context.Background(), dd).Val() == session.DedupProduced(first.deadline)
	})
	if err := h.store.MarkStale(context.Background(), "user", 1, first.deadline, first.deadline); err != nil {
		t.Fatal(err)
	}
	second := h.renew("user", "default", 300*time.Millisecond)
	h.waitProduced(2)
	if now := h.redisNow(); !now.Before(windowEnd) {
		t.Fatalf("the test ran past its minute window (%v); the case was not tested", now)
	}
	evs := h.events()
	if len(evs) != 2 {
		t.Fatalf("events %+v, want 2", evs)
	}
	checkEvent(t, evs[0], first, timeoutevent.SourceSweep)
	checkEvent(t, evs[1], second, timeoutevent.SourceSweep)
}

// TestSecondSilenceDeferredToWindowEnd: a user's first silence in a
// minute window may have been guided; a second silence in that window is
// held to the window's end and produced then, once, because the user is
// still silent. Another user's second silence, who comes back meanwhile,
// is not produced at all.
func TestSecondSilenceDeferredToWindowEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the end of a minute")
	}
	t.Parallel()
	h := newHarness(t)
	stop := h.start(h.config(ModeSweep))
	defer stop()
	windowEnd := h.waitSecondOfMinute(50, 56)
	h.renew("still", "default", 300*time.Millisecond)
	h.renew("back", "default", 300*time.Millisecond)
	h.waitProduced(2)
	second := h.renew("still", "default", 300*time.Millisecond)
	h.renew("back", "default", 300*time.Millisecond)
	waitFor(t, waitLong, "both second silences to be held, or produced", func() bool {
		held := h.heldUIDs()
		return held["still"] && held["back"] || h.produced() > 2
	})
	if n := h.produced(); n != 2 {
		t.Fatalf("%d events before the window ended, want 2", n)
	}
	if held := h.heldUIDs(); !held["still"] || !held["back"] {
		t.Fatalf("held %v, want both second silences", held)
	}
	h.renew("back", "default", time.Minute) // came back
	h.waitProduced(3)
	h.sweptPast(h.redisNow()) // and nothing more
	evs := h.events()
	if len(evs) != 3 {
		t.Fatalf("events %+v, want 3", evs)
	}
	last := evs[2]
	checkEvent(t, last, second, timeoutevent.SourceSweep)
	if at := time.UnixMilli(last.DetectedMS); at.Before(windowEnd) || at.After(windowEnd.Add(2*time.Second)) {
		t.Errorf("second silence produced at %v, want just after its window's end %v", at, windowEnd)
	}
}
