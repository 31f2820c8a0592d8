package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attack tests of the brake's count of a first stage released from a
// short hold (lapse in verdict.go): a crowd held first by another short
// hold than a stall of the listener's own read must engage the brake as
// well, and a user of it back within the grace is not guided.

// runFeed plays a member of the activity feed that is caught up: every
// stamp it reads Redis's clock and stamps its one partition with it, as
// a member does that applied every record up to the partition's end. It
// stamps until the returned stop is called.
func (h *harness) runFeed(every time.Duration) (stop func()) {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	stamp := func() {
		now, err := h.store.ActivityClock(ctx)
		if err != nil {
			return
		}
		st := session.FeedStamp{Gap: time.Minute, Every: every, Topic: "acts", Partitions: 1,
			CaughtUp: map[int32]time.Time{0: now}}
		h.store.ActivityCaughtUp(ctx, st)
	}
	stamp()
	go func() {
		defer close(done)
		t := time.NewTicker(every) // the member's cadence: real time passes between stamps
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				stamp()
			}
		}
	}()
	return func() { cancel(); <-done }
}

// crowdKeepsTheBrake runs a crowd of uids lapsing together with ttl from
// now, ten of them back 3 s before the grace after their deadlines ends,
// and checks that none of those ten is guided (with allowEarly, none
// found after it was back), and every other one once, a grace after its
// deadline. between runs after the deadlines, before
// the ten come back (a stall).
//
// allowEarly is how many of the crowd may be guided before the grace:
// with two replicas, the one that counts its share of the crowd first
// counts no more than the brake's threshold, and produces it at once, as
// the brake lets out the first lapses of a window up to its threshold.
func crowdKeepsTheBrake(t *testing.T, h *harness, uids []string, grace time.Duration, allowEarly int, between func(last time.Time)) {
	t.Helper()
	from := h.redisNow()
	crowd, last := h.crowdAt(uids, crowdLead)
	if between != nil {
		between(last)
	}
	back := uids[:10]
	h.untilRedis(last.Add(grace - 3*time.Second))
	backAt := make(map[string]time.Time, len(back))
	const away = 10 * time.Minute
	for _, uid := range back {
		g := h.renew(uid, "one", away)
		backAt[uid] = g.deadline.Add(-away) // by its master's clock, as its detection is
		delete(crowd, uid)
	}
	h.waitProduced(len(crowd))
	h.sweptPast(h.redisNow())
	by := byUID(h.events())
	for _, uid := range back {
		evs := by[uid]
		if len(evs) == 0 {
			continue
		}
		ev := evs[0]
		if allowEarly == 0 || !time.UnixMilli(ev.DetectedMS).Before(backAt[uid]) {
			t.Errorf("%s guided %v after its deadline, though it was back %v after it, within the grace of %v, in a mass expiry",
				uid, time.Duration(ev.DetectedMS-ev.DeadlineMS)*time.Millisecond, backAt[uid].Sub(time.UnixMilli(ev.DeadlineMS)), grace)
		}
		// Found before it was back: one of those let out early, and
		// counted with the crowd's below (once).
		crowd[uid] = grant{segment: "one", deadline: time.UnixMilli(ev.DeadlineMS)}
	}
	early := 0
	checkStorm(t, by, crowd)
	for uid := range crowd {
		ev := by[uid][0]
		if late := time.Duration(ev.DetectedMS-ev.DeadlineMS) * time.Millisecond; late < grace-250*time.Millisecond {
			early++
		}
	}
	if early > allowEarly {
		t.Errorf("%d of the crowd of %d guided before the grace (%v) after their deadlines, more than %d: the brake did not hold them",
			early, len(crowd), grace, allowEarly)
	}
	checkExactlyOnce(t, h.events(), crowd, timeoutevent.SourceSweep, timeoutevent.SourceEvent)
	// Each silence is one lapse: one the brake held and released a grace
	// after its deadline is not counted again (the window is a minute in
	// these tests, so every count is still there). With two replicas a
	// silence may count twice: one that read it before the other's brake
	// hold moved it claims it once that hold released its claim, and
	// counts it (as before any hold was counted: over-counting only holds
	// more), so there at least once and at most twice.
	n := h.lapsesCounted(from, h.redisNow())
	switch {
	case allowEarly == 0 && n != len(uids):
		t.Errorf("%d silences counted %d lapses", len(uids), n)
	case n < len(uids) || n > 2*len(uids):
		t.Errorf("%d silences counted %d lapses, want between %d and %d with two replicas", len(uids), n, len(uids), 2*len(uids))
	}
}

// crowdLead is how far ahead a crowd's common deadline is set: time for a
// busy host to renew it all.
const crowdLead = 3 * time.Second

// crowdAt renews uids (segment "one") so that their deadlines fall
// together, about lead from now by Redis's clock, however long the
// renewals take: each one's TTL is what is left until then. With one TTL
// for all, on a busy host a hundred renewals took longer than it, and the
// crowd lapsed a few at a time, the first of them below the brake's
// threshold. It returns the grants and the latest deadline.
func (h *harness) crowdAt(uids []string, lead time.Duration) (map[string]grant, time.Time) {
	h.t.Helper()
	at := h.redisNow().Add(lead)
	crowd := make(map[string]grant, len(uids))
	var last time.Time
	for _, uid := range uids {
		ttl := at.Sub(h.redisNow())
		if ttl < 200*time.Millisecond {
			h.t.Fatalf("renewing a crowd of %d took more than %v", len(uids), lead-200*time.Millisecond)
		}
		g := h.renew(uid, "one", ttl)
		crowd[uid] = g
		last = later(last, g.deadline)
	}
	return crowd, last
}

// TestAttackFeedHoldKeepsTheBrake: with the activity feed on, every
// deadline at or past its watermark is held until the next stamp (the
// watermark hold, activityRelease), well within the grace, and released
// rechecked. A crowd lapsing together must engage the brake all the same.
func TestAttackFeedHoldKeepsTheBrake(t *testing.T) {
	t.Parallel()
	for _, tc := range stallModes {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.brakePolicy()
			stopFeed := h.runFeed(500 * time.Millisecond)
			defer stopFeed()
			const grace = 8 * time.Second
			stop := h.start(lapseConfig(h, tc.prefetch, grace))
			defer stop()
			h.sweptPast(h.redisNow())
			uids := make([]string, 120)
			for i := range uids {
				uids[i] = "feed-" + string(rune('a'+i/26)) + string(rune('a'+i%26))
			}
			crowdKeepsTheBrake(t, h, uids, grace, 0, nil)
		})
	}
}

// TestAttackStallKeepsTheBrakeElsewhere: TestStallKeepsTheBrake on the
// read-ahead path, and with two replicas sharing the crowd. With two, the
// stall releases the crowd to both at once; the one that claims and
// counts its share first may count fewer than the threshold and produce
// them at once (a user of them back within the grace is guided before
// it is back), as the brake lets out the first lapses of any window up to
// its threshold: so up to the threshold may be early, and no more.
func TestAttackStallKeepsTheBrakeElsewhere(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster pause")
	}
	t.Parallel()
	for _, tc := range []struct {
		name     string
		prefetch bool
		replicas int
	}{
		{"prefetch", true, 1},
		{"sweep, two replicas", false, 2},
		{"prefetch, two replicas", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newClusterHarness(t, false)
			h.brakePolicy()
			victim, uids := h.stallVictim(120)
			const grace = 8 * time.Second
			for range tc.replicas {
				cfg := lapseConfig(h, tc.prefetch, grace)
				cfg.SweepGapMax = DefaultConfig().SweepGapMax
				stop := h.start(cfg)
				defer stop()
			}
			h.sweptPast(h.redisNow())
			// With two replicas the first to count may let its share
			// out, up to the threshold. (A busy CI run once let 54 of
			// 120 out at a threshold of 50: each replica counted into
			// the second its mark had read, and two marks on either
			// side of a second summed windows that missed each other's
			// share; TestAttackCountSplitBySecond.)
			allow := 0
			if tc.replicas > 1 {
				allow = h.brakeConfig(ModeSweep).MassExpiryFloor
			}
			crowdKeepsTheBrake(t, h, uids, grace, allow, func(last time.Time) {
				h.untilRedis(last.Add(-300 * time.Millisecond))
				h.pauseWrites(victim, 1500*time.Millisecond)
			})
		})
	}
}

// lapsesCounted sums the brake's lapse counts of the seconds from..to.
func (h *harness) lapsesCounted(from, to time.Time) int {
	h.t.Helper()
	ks := h.store.Keyspace()
	n := 0
	for s := from.Unix(); s <= to.Unix(); s++ {
		v, err := h.rdb.Get(context.Background(), ks.LapsesKey(s)).Int()
		if err == nil {
			n += v
		}
	}
	return n
}

// TestAttackFeedTrickleCountedOnce: with the activity feed on, a normal
// trickle of silences, each held by the watermark hold (some more than
// once, the feed stamping on its cadence) before its claim, is counted
// once a silence: not twice, which would engage the brake for a trickle
// below its threshold and make every guide a grace late.
func TestAttackFeedTrickleCountedOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range stallModes {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.brakePolicy()
			stopFeed := h.runFeed(300 * time.Millisecond)
			defer stopFeed()
			const grace = 8 * time.Second
			stop := h.start(lapseConfig(h, tc.prefetch, grace))
			defer stop()
			h.sweptPast(h.redisNow())
			from := h.redisNow()
			// 40 silences, below the threshold of 50, over 4 s.
			want := map[string]grant{}
			for i := range 40 {
				uid := "trickle-" + string(rune('a'+i/26)) + string(rune('a'+i%26))
				want[uid] = h.renew(uid, "one", 500*time.Millisecond+time.Duration(i)*100*time.Millisecond)
			}
			h.waitProduced(len(want))
			h.sweptPast(h.redisNow())
			by := byUID(h.events())
			checkStorm(t, by, want)
			if n := h.lapsesCounted(from, h.redisNow()); n != len(want) {
				t.Errorf("%d silences counted %d lapses", len(want), n)
			}
			for uid := range want {
				if late := time.Duration(by[uid][0].DetectedMS-by[uid][0].DeadlineMS) * time.Millisecond; late >= grace-250*time.Millisecond {
					t.Errorf("%s guided %v after its deadline, a trickle held by the brake", uid, late)
				}
			}
		})
	}
}

// TestAttackBrakeReleaseCountedAgain: a crowd's first stage the brake
// counted and held is released by the hold set at the grace after its
// deadline, by the clock of the master that serves its bucket; it is
// judged by the control state's clock (another master in a cluster, whose
// mark runs beside the bucket's read in the read-ahead's pipeline, or a
// master a failover promoted a little behind in time). When that clock
// reads a few ms before the grace ran out, the release is a "first stage
// released from a hold within its grace" (lapse, since 038d717): counted
// a second time, in the window after the grace, so that the brake engages
// again, or stays engaged, for a crowd it already let out, and holds the
// ordinary silences of that window for a grace. Rechecked says only that
// a hold released it, not which one: the brake's hold, the one hold that
// counts its timeouts before it holds them, is not told apart.
func TestAttackBrakeReleaseCountedAgain(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	const grace = 10 * time.Second
	due := t0
	for _, skew := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 50 * time.Millisecond} {
		// Released by its bucket's master at due+grace; the control
		// state read skew behind it.
		f := facts{control: session.Control{Now: due.Add(grace - skew)}, grace: grace, sweepEvery: 100 * time.Millisecond}
		to := timeout{
			Expired: session.Expired{UID: "u", Segment: session.DefaultSegment, Deadline: due, Detected: due.Add(grace),
				Stage: 1, Due: due, Rechecked: true},
			claim: claimed{outcome: session.ClaimFresh},
		}
		if lapse(f, to) {
			t.Errorf("a first stage the brake held (counted then) and released at the grace after its deadline, judged by a control clock %v behind its bucket's, counts as a lapse again", skew)
		}
	}
}

// lapseConfig is the brake's config for these tests, in sweep mode or
// with the read-ahead, with grace, and a lapse window that outlives the
// test so that every count can be read after it.
func lapseConfig(h *harness, prefetch bool, grace time.Duration) Config {
	cfg := h.brakeConfig(ModeHybrid)
	if !prefetch {
		cfg.Mode, cfg.PrefetchInterval = ModeSweep, 0
	}
	cfg.OutageGrace = grace
	cfg.MassExpiryWindow = time.Minute
	return cfg
}
