package expiry

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attack tests, third round, of the brake's count of lapses: the second a
// share is counted into (the batch's mark), and the lapses a failed count
// carries (brake.uncounted).

// TestAttackCountMarkLateAfterFind: a replica counts its lapses into the
// second of its batch's mark, taken to be when it found them; but the
// mark is read after the sweep's read of the due index (sweep: "the
// control state is read after the sweep"), and anything between the two
// (a starved or paused process, the mark's own round trip held in a
// write pause) puts the mark later than the find, by as long. Two
// replicas find one crowd of 90 (deadlines within ms of each other) in
// the same sweep round, at a threshold of 50 in a window of 2 s. A marks,
// claims and counts its 45 at once. B, which read the same due entries
// at the same time, is not scheduled for 2.2 s before its mark; it then
// claims and counts its 45 into the second of its late mark, and sums
// from the window before that second: A's share, counted in the second
// both found the crowd in, is a second before it. Each count sees 45, and
// all 90 go out at once, found within ms of each other. With the default
// window of 10 s the same takes a mark 10 s after the find.
func TestAttackCountMarkLateAfterFind(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.brakePolicy()
	cfgA, cfgB := h.brakeConfig(ModeSweep), h.brakeConfig(ModeSweep)
	for _, c := range []*Config{&cfgA, &cfgB} {
		c.PrefetchInterval = 0
		c.MassExpiryWindow = 2 * time.Second
		// No sweep gap between A's mark and B's: the gap rule is not
		// what this test is about.
		c.SweepGapMax = 10 * time.Second
	}
	a, b := h.openIdle(cfgA), h.openIdle(cfgB)
	ctx := context.Background()

	uids := make([]string, 90)
	for i := range uids {
		uids[i] = fmt.Sprintf("found-%02d", i)
	}
	crowd, _ := h.crowdAt(uids, 2*time.Second)
	var due []session.Expired
	waitFor(t, waitLong, "the crowd's deadlines to pass", func() bool {
		var err error
		due, _, err = h.store.Due(ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return len(due) == len(crowd)
	})
	// Both replicas' sweeps read the due index now; each takes its share.
	dueA, dueB := due[:45], due[45:]
	found := h.redisNow()

	// A marks, claims and counts at once.
	cA, err := a.marker.mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.emit(ctx, cA, dueA, timeoutevent.SourceSweep); err != nil {
		t.Fatal(err)
	}
	// B's process is not scheduled between its read and its mark: real
	// time must pass, as it would for the starved process.
	h.untilRedis(found.Add(2200 * time.Millisecond))
	cB, err := b.marker.mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.emit(ctx, cB, dueB, timeoutevent.SourceSweep); err != nil {
		t.Fatal(err)
	}

	held := h.heldUIDs()
	out := 0
	for uid := range crowd {
		if !held[uid] {
			out++
		}
	}
	if threshold := cfgA.MassExpiryFloor; out > threshold {
		t.Errorf("%d of a crowd of %d found together let out at once, %d held, at a threshold of %d in a window of %v: B counted its share into its mark's second, %v after it found them, in a window without A's",
			out, len(crowd), len(crowd)-out, threshold, cfgA.MassExpiryWindow, cB.Now.Sub(found).Round(100*time.Millisecond))
	}
}

// TestAttackUncountedTrickleEngagesTheBrake: while counts fail (a Redis
// fault of a minute), the lapses a replica could not count are carried
// into its next count that works, as long as each lapse came within the
// window after the one before (the carry's age was the last's): a normal
// trickle of silences, a few every second or two, keeps the carry alive
// however long the fault lasts, and it grows without bound. Here 5 lapse
// every 1.5 s for 18 s, never more than 10 in a window of 2 s, at a
// threshold of 50: once counts work again, the first count adds all 60
// into one second, engages the brake for a crowd that never was, and
// every lapse and later stage of the window after (the one counted with
// it first) is held for the grace. The carry must not count a lapse into
// a window it was not in; here the counts are the replica's batches, each
// at its mark, as its sweeps pass them.
func TestAttackUncountedTrickleEngagesTheBrake(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.brakeConfig(ModeSweep)
	cfg.PrefetchInterval = 0
	cfg.MassExpiryWindow = 2 * time.Second
	l := h.openIdle(cfg)
	ctx := context.Background()

	cur := h.redisNow()
	// The fault: every count whose window or second covers the last 20 s
	// fails.
	from, to := cur.Add(-25*time.Second), cur
	h.breakLapseCounts(from, to)
	trickle := 0
	for k := 11; k >= 0; k-- {
		mark := cur.Add(-time.Second - time.Duration(k)*1500*time.Millisecond)
		if !l.braking(ctx, mark, slices.Repeat([]time.Time{mark}, 5)) {
			t.Fatalf("a batch whose count failed (mark %v) was not held", mark)
		}
		trickle += 5
	}
	if !l.brake.countFailing {
		t.Fatal("the counts did not fail")
	}
	// Redis counts again.
	ks := h.store.Keyspace()
	for sec := from.Unix(); sec <= to.Unix(); sec++ {
		if err := h.rdb.Del(ctx, ks.LapsesKey(sec)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// One ordinary silence.
	if l.braking(ctx, cur, []time.Time{cur}) || l.brake.engaged {
		t.Errorf("the brake engaged for one lapse after a trickle of %d over %v (never more than 10 in a window of %v), at a threshold of %d: the counter of its second holds %d, the trickle's lapses carried into it",
			trickle, 16500*time.Millisecond+time.Second, cfg.MassExpiryWindow, cfg.MassExpiryFloor, h.lapsesCounted(cur, cur))
	}
}
