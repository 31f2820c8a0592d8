package expiry

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// slowReads is a config whose timeouts only the prefetch path's timers
// can find soon: a read every 8s reaching 30s ahead, and no safety sweep
// within the test. A timeout found by a read rather than by its timer is
// seconds late.
func (h *harness) slowReads() Config {
	cfg := h.config(ModeSweep)
	cfg.PrefetchInterval, cfg.PrefetchAhead = 8*time.Second, 30*time.Second
	cfg.SweepGapMax = 2 * cfg.PrefetchInterval
	cfg.SafetySweepInterval = 10 * time.Minute
	return cfg
}

// onlyPrefetch is the tests' config with the safety sweep out of the
// test's reach: what is found, the prefetch path found.
func (h *harness) onlyPrefetch() Config {
	cfg := h.config(ModeSweep)
	cfg.SafetySweepInterval = 10 * time.Minute
	return cfg
}

// lateness is how late each event of want was detected past its
// deadline, by Redis's clock.
func lateness(t *testing.T, evs []timeoutevent.Event, want map[string]grant) map[string]time.Duration {
	t.Helper()
	out := map[string]time.Duration{}
	for _, ev := range evs {
		if _, ok := want[ev.UID]; ok {
			out[ev.UID] = time.Duration(ev.DetectedMS-ev.DeadlineMS) * time.Millisecond
		}
	}
	return out
}

// TestPrefetchFindsByTimers: deadlines read ahead are found by their
// timers, seconds before the next read could find them; a deadline written
// inside a window read already is found by the next read, within the
// prefetch interval; each once. The bounds are loose (a busy machine
// stalls): latency is the benchmark's to show; this shows which path
// found each.
func TestPrefetchFindsByTimers(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.slowReads()
	// The next read long after the first: a timer a starved machine fires
	// seconds late still comes before it.
	cfg.PrefetchInterval = 10 * time.Second
	cfg.SweepGapMax = 2 * cfg.PrefetchInterval
	// Read by the first read, at start: deadlines 3-4s away.
	early := h.silentOver("early", 20, 3*time.Second, time.Second)
	started := h.redisNow()
	stop := h.start(cfg)
	// Inside the 30s window that first read covered.
	inside := map[string]grant{"inside": h.renew("inside", "default", 300*time.Millisecond)}
	want := maps.Clone(early)
	maps.Copy(want, inside)
	h.waitProduced(len(want))
	h.waitSettled(slices.Collect(maps.Keys(want)))
	stop()
	evs := h.events()
	checkExactlyOnce(t, evs, want, timeoutevent.SourceSweep)
	// The next read comes a prefetch interval after the start: what was
	// found before then, a timer found.
	next := started.Add(cfg.PrefetchInterval).UnixMilli()
	for _, ev := range evs {
		if _, ok := early[ev.UID]; !ok || ev.DetectedMS < next {
			continue
		}
		late := time.Duration(ev.DetectedMS-ev.DeadlineMS) * time.Millisecond
		// A round trip of the listener's that stalled (a starved test
		// machine) holds what fell due in it (stall.go): its release
		// may come after the next read, which is right.
		tl := steps(h.timelineOf(ev.UID))
		if slices.ContainsFunc(tl, func(s string) bool { return strings.HasPrefix(s, string(timeline.KindHeld)) }) {
			t.Logf("%s found %v past its deadline, after a hold: %v", ev.UID, late, tl)
			continue
		}
		t.Errorf("%s found %v past its deadline, after the next read began: by a read, not by its timer (timeline %v)", ev.UID, late, tl)
	}
	if late := lateness(t, evs, inside)["inside"]; late > cfg.PrefetchInterval+4*time.Second {
		t.Errorf("a deadline inside a window read already was found %v late, want within the prefetch interval (%v)", late, cfg.PrefetchInterval)
	}
}

// TestPrefetchRenewalNotGuided: a user who renews after their deadline
// was read ahead, before it passes, is not guided: Redis answers "not
// due" when the timer fires.
func TestPrefetchRenewalNotGuided(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// back's deadline is no later than gone's: by the time gone's event is
	// out, back's timer fired and was answered (one pipeline goroutine).
	back := h.renew("back", "default", 3*time.Second)
	gone := map[string]grant{"gone": h.renew("gone", "default", 3*time.Second)}
	stop := h.start(h.slowReads())
	h.untilRedis(back.deadline.Add(-500 * time.Millisecond))
	h.renew("back", "default", time.Minute)
	h.waitProduced(1)
	stop()
	evs := h.events()
	checkExactlyOnce(t, evs, gone, timeoutevent.SourceSweep)
	if late := lateness(t, evs, gone)["gone"]; late > 3500*time.Millisecond {
		t.Errorf("gone found %v late: by a read, so back's timer may never have been armed", late)
	}
	if !h.inIndex("back") {
		t.Error("back's renewed entry left the index")
	}
}

// TestPrefetchRedisRestart: after Redis restarts, the listener reads its
// windows again from now: deadlines written after the restart inside the
// window it had read before are found by their timers, not a read late.
func TestPrefetchRedisRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	cfg := h.slowReads()
	first := h.silentOver("first", 5, 2*time.Second, 500*time.Millisecond)
	stop := h.start(cfg)
	h.waitProduced(len(first)) // reading ahead: the window reaches 30s on
	before := len(h.blindList(ctx))
	if err := h.srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "the restart to be marked", func() bool { return len(h.blindList(ctx)) > before })
	// Past the restart's grace, so no outage rule holds them; more than a
	// read interval away, so a read finds them ahead if it reads from now.
	after := h.silentOver("after", 20, cfg.PrefetchInterval+2*time.Second, 2*time.Second)
	want := maps.Clone(first)
	maps.Copy(want, after)
	h.waitProduced(len(want))
	h.waitSettled(slices.Collect(maps.Keys(after)))
	stop()
	evs := h.events()
	checkExactlyOnce(t, evs, want, timeoutevent.SourceSweep)
	for uid, late := range lateness(t, evs, after) {
		// Found by a read instead: up to 8s late, evenly spread.
		if late > 3*time.Second {
			t.Errorf("%s found %v past its deadline: the windows were not read again after the restart", uid, late)
		}
	}
}

// listenerMark is replica id's mark in the control keys, "" when none.
func (h *harness) listenerMark(id string) string {
	h.t.Helper()
	v, _ := h.rdb.HGet(context.Background(), h.store.Keyspace().ListenersKey(), id).Result()
	return v
}

// TestOwnershipChanges: with only the prefetch path finding timeouts,
// every silence is found exactly once while a replica joins, leaves, or
// dies (its mark stays until it goes stale, as after SIGKILL): its buckets
// pass to the other replica.
func TestOwnershipChanges(t *testing.T) {
	t.Run("join", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		stopA := h.start(h.onlyPrefetch())
		want := h.silentOver("before", 40, 300*time.Millisecond, 2*time.Second)
		b, stopB := h.startListener(h.onlyPrefetch())
		waitFor(t, waitLong, "the newcomer's mark", func() bool { return h.listenerMark(b.marker.id) != "" })
		maps.Copy(want, h.silentOver("after", 40, 300*time.Millisecond, 2*time.Second))
		h.waitProduced(len(want))
		h.waitSettled(slices.Collect(maps.Keys(want)))
		stopA()
		stopB()
		checkExactlyOnce(t, h.events(), want, timeoutevent.SourceSweep)
	})
	t.Run("leave", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		a, stopA := h.startListener(h.onlyPrefetch())
		b, stopB := h.startListener(h.onlyPrefetch())
		waitFor(t, waitLong, "both marks", func() bool {
			return h.listenerMark(a.marker.id) != "" && h.listenerMark(b.marker.id) != ""
		})
		want := h.silentOver("user", 60, 500*time.Millisecond, 3*time.Second)
		stopA() // its buckets pass to b
		h.waitProduced(len(want))
		h.waitSettled(slices.Collect(maps.Keys(want)))
		stopB()
		checkExactlyOnce(t, h.events(), want, timeoutevent.SourceSweep)
	})
	t.Run("die", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		a, stopA := h.startListener(h.onlyPrefetch())
		b, stopB := h.startListener(h.onlyPrefetch())
		var mark string
		waitFor(t, waitLong, "both marks", func() bool {
			mark = h.listenerMark(a.marker.id)
			return mark != "" && h.listenerMark(b.marker.id) != ""
		})
		want := h.silentOver("user", 60, 500*time.Millisecond, 4*time.Second)
		stopA()
		// As if killed: its last mark stays, and b counts on it until it
		// is stale.
		if err := h.rdb.HSet(context.Background(), h.store.Keyspace().ListenersKey(), a.marker.id, mark).Err(); err != nil {
			t.Fatal(err)
		}
		h.waitProduced(len(want))
		h.waitSettled(slices.Collect(maps.Keys(want)))
		stopB()
		checkExactlyOnce(t, h.events(), want, timeoutevent.SourceSweep)
	})
}
