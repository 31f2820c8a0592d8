package expiry

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attack tests of the brake's count of lapses (braking, Store.Lapses):
// the count two replicas share, and a count that fails.

// openIdle opens a listener replica without running it, for a test that
// drives its steps itself, in the order it needs: the steps of a running
// one are the pipeline goroutine's own, this one has none.
func (h *harness) openIdle(cfg Config) *Listener {
	h.t.Helper()
	l, err := Open(context.Background(), cfg, h.logger("expiry-listener"))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { l.Close() })
	return l
}

// breakLapseCounts makes every count of lapses whose window covers a
// second from..to fail: a hash where each second's counter should be.
func (h *harness) breakLapseCounts(from, to time.Time) {
	h.t.Helper()
	ks := h.store.Keyspace()
	for sec := from.Unix(); sec <= to.Unix(); sec++ {
		if err := h.rdb.HSet(context.Background(), ks.LapsesKey(sec), "not", "a counter").Err(); err != nil {
			h.t.Fatal(err)
		}
	}
}

// TestAttackCountSplitBySecond: two replicas share a crowd of 90 lapses,
// 45 each, at a threshold of 50. Each counts its lapses in the second of
// its own mark (control.Now), read before its claims, and sums the window
// that ends with that second. Replica A marks in one second; B marks just
// after Redis's clock turned to the next, claims and counts its 45 first
// (in the next second's counter) while A's claims are still in flight;
// then A counts its 45 in the second of its mark, whose window ends before
// B's counter: neither count sees more than 45, and all 90 go out at
// once. A's mark need only be a few ms older than B's and fall on the
// other side of a second: two replicas leaving one stall together (as in
// TestAttackStallKeepsTheBrakeElsewhere) mark within ms of each other. The
// brake lets out the first lapses of a window up to its threshold, and no
// more.
func TestAttackCountSplitBySecond(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.brakePolicy()
	cfgA, cfgB := h.brakeConfig(ModeSweep), h.brakeConfig(ModeSweep)
	cfgA.PrefetchInterval, cfgB.PrefetchInterval = 0, 0
	a, b := h.openIdle(cfgA), h.openIdle(cfgB)
	ctx := context.Background()

	crowd := map[string]grant{}
	for i := range 90 {
		side := "a"
		if i%2 == 1 {
			side = "b"
		}
		uid := fmt.Sprintf("split-%s-%02d", side, i)
		crowd[uid] = h.renew(uid, "one", 500*time.Millisecond)
	}
	var due []session.Expired
	waitFor(t, waitLong, "the crowd's deadlines to pass", func() bool {
		var err error
		due, _, err = h.store.Due(ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return len(due) == len(crowd)
	})
	var dueA, dueB []session.Expired
	for _, e := range due {
		if strings.HasPrefix(e.UID, "split-a-") {
			dueA = append(dueA, e)
		} else {
			dueB = append(dueB, e)
		}
	}

	// A marks (the control state its batch is judged by) ...
	cA, err := a.marker.mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// ... and B marks once Redis's clock is in the next second: real
	// time must pass for it to turn.
	h.untilRedis(time.Unix(cA.Now.Unix()+1, 0))
	cB, err := b.marker.mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// B's batch is counted first, then A's, whose claims took longer.
	if _, err := b.emit(ctx, cB, dueB, timeoutevent.SourceSweep); err != nil {
		t.Fatal(err)
	}
	if _, err := a.emit(ctx, cA, dueA, timeoutevent.SourceSweep); err != nil {
		t.Fatal(err)
	}

	held := h.heldUIDs()
	out := 0
	for uid := range crowd {
		if !held[uid] {
			out++
		}
	}
	threshold := cfgA.MassExpiryFloor
	if out > threshold {
		t.Errorf("%d of a crowd of %d lapsing within %v let out at once, %d held, at a threshold of %d: the replica that marked a second earlier counted %d lapses in its window, not the other's",
			out, len(crowd), cfgA.MassExpiryWindow, len(crowd)-out, threshold, len(dueA))
	}
	if n := h.lapsesCounted(cA.Now.Add(-time.Second), h.redisNow()); n != len(crowd) {
		t.Errorf("%d lapses counted, want %d", n, len(crowd))
	}
}

// TestAttackUncountableCrowdLaterStages: a crowd lapses while every count
// of lapses fails. Each first stage is held for the grace, as if the brake
// were engaged (braking), and released. The brake, engaged, holds the
// later stages of a crowd too (brakeWouldHold: a close must not end the
// chat of someone who answered their reminder within the grace, cut off
// from us as the crowd may be; TestBrakeHoldsLaterStages).
//
//   - The count keeps failing: a batch of later stages has no lapse to
//     count (n == 0), and a count that fails with nothing to count holds
//     nothing: each crowd user's second reminder goes out at once, its
//     close a second later, and a user of the crowd who answers 1.5s after
//     its second reminder was due is closed first. In every mode.
//   - The count works again once the crowd is held: a first stage the
//     brake held and released a grace after it was due is no new lapse
//     (lapse: "the brake's own hold counted it when it held it"), but a
//     hold for a count that failed counted nothing: the brake never
//     learns of the crowd, and its later stages go out at once, as above,
//     where a crowd it could count keeps it engaged for them.
func TestAttackUncountableCrowdLaterStages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		mode    string
		recover bool
	}{
		{"keeps failing, sweep", ModeSweep, false},
		{"keeps failing, hybrid", ModeHybrid, false},
		{"keeps failing, events", ModeEvents, false},
		{"works again, sweep", ModeSweep, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			uncountableCrowdStages(t, tc.mode, tc.recover)
		})
	}
}

func uncountableCrowdStages(t *testing.T, mode string, recover bool) {
	h := newHarness(t)
	h.brakePolicy()
	now := h.redisNow()
	// Every count from before the crowd to well after its last stage.
	from, to := now.Add(-15*time.Second), now.Add(testGrace+waitLong+releaseSlack)
	h.breakLapseCounts(from, to)
	cfg := h.brakeConfig(mode)
	if mode == ModeSweep {
		cfg.PrefetchInterval = 0
	}
	stop := h.start(cfg)
	defer stop()
	if mode != ModeSweep {
		h.waitSubscribed(1)
	}
	h.sweptPast(h.redisNow())

	all := map[string]grant{}
	for i := range 120 {
		uid := fmt.Sprintf("stages-%03d", i)
		all[uid] = h.renew(uid, "three", time.Second)
	}
	if recover {
		// Redis answers the count again once the crowd is held: the
		// broken counters go.
		waitFor(t, waitLong, "the crowd to be held", func() bool { return len(h.heldUIDs()) == len(all) })
		ks := h.store.Keyspace()
		for sec := from.Unix(); sec <= to.Unix(); sec++ {
			if err := h.rdb.Del(context.Background(), ks.LapsesKey(sec)).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	const answers = "stages-000"
	crowd := maps.Clone(all)
	delete(crowd, answers)
	var first timeoutevent.Event
	waitFor(t, waitLong+testGrace, answers+"'s first reminder", func() bool {
		evs := byUID(h.events())[answers]
		if len(evs) > 0 {
			first = evs[0]
		}
		return len(evs) > 0
	})
	if late := time.Duration(first.DetectedMS-first.DeadlineMS) * time.Millisecond; late < testGrace-250*time.Millisecond {
		t.Fatalf("%s's first reminder %v after its deadline: not held for the grace while lapses could not be counted (see TestBrakeHoldsWhenItCannotCount)", answers, late)
	}
	// answers replies 1.5s after its second reminder was due, within
	// the grace after it.
	due2 := time.UnixMilli(max(first.DueMS, first.DetectedMS)).Add(time.Second)
	h.untilRedis(due2.Add(1500 * time.Millisecond))
	h.renew(answers, "three", 10*time.Minute)

	waitFor(t, waitLong+testGrace+releaseSlack, "every close of the crowd", func() bool {
		by := byUID(h.events())
		for uid := range crowd {
			if len(by[uid]) < 3 {
				return false
			}
		}
		return true
	})
	h.sweptPast(h.redisNow())
	by := byUID(h.events())
	if got := by[answers]; len(got) != 1 {
		stages := make([]string, len(got))
		for i, ev := range got {
			stages[i] = fmt.Sprintf("stage %d %v after due", ev.Stage, time.Duration(ev.DetectedMS-ev.DueMS)*time.Millisecond)
		}
		t.Errorf("%s, who answered 1.5s after its second reminder was due, within the grace, got %d events (%s), want the first only",
			answers, len(got), strings.Join(stages, ", "))
	}
	early := map[int]int{}
	for uid := range crowd {
		evs := by[uid]
		if len(evs) != 3 {
			t.Fatalf("%s: %d events, want 3 stages", uid, len(evs))
		}
		for i, ev := range evs {
			if ev.Stage != i+1 {
				t.Fatalf("%s: events %+v, want stages 1 to 3 in order", uid, evs)
			}
			if late := time.Duration(ev.DetectedMS-ev.DueMS) * time.Millisecond; late < testGrace-250*time.Millisecond {
				early[ev.Stage]++
			}
		}
	}
	for stage := 1; stage <= 3; stage++ {
		if n := early[stage]; n > 0 {
			t.Errorf("stage %d of %d of the crowd of %d went out within the grace after it was due: not held as the brake, engaged for a crowd, holds it",
				stage, n, len(crowd))
		}
	}
}
