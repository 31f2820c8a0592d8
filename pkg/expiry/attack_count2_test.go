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

// Attack tests, second round, of the brake's count of lapses: the lapses
// a failed count carries (brake.uncounted) and the second a count goes
// to (Store.Lapses, lapses.lua).

// TestAttackUncountedCarriedPastWindow: a crowd of 45, below the
// brake's threshold of 50, lapses while lapses cannot be counted (a
// short Redis fault). Each is held for the grace, as designed, and the
// replica carries the 45 it could not count (brake.uncounted) into its
// next count that works. That count comes whenever the next lapse does,
// however long after: here more than a window after the crowd, when 6
// ordinary silences lapse together. Their count is 6 + 45 = 51, over the
// threshold, in a window in which 6 lapsed: the brake engages for a crowd
// that is long gone (and was never one), and the 6 are guided a grace
// late, as is every lapse and later stage of the window after. Lapses no
// count could place must not be counted into a window they were not in.
func TestAttackUncountedCarriedPastWindow(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.brakePolicy()
	cfg := h.brakeConfig(ModeSweep)
	cfg.PrefetchInterval = 0
	window := cfg.MassExpiryWindow
	stop := h.start(cfg)
	defer stop()
	h.sweptPast(h.redisNow())

	// The blip: a crowd of 45 lapses together while every count fails.
	blip := make([]string, 45)
	for i := range blip {
		blip[i] = fmt.Sprintf("blip-%02d", i)
	}
	crowd, last := h.crowdAt(blip, crowdLead)
	from, to := last.Add(-2*time.Second), last.Add(3*time.Second)
	h.breakLapseCounts(from, to)
	waitFor(t, waitLong, "the blip's 45 to be held (a count that fails holds its lapses)", func() bool {
		held := h.heldUIDs()
		for uid := range crowd {
			if !held[uid] {
				return false
			}
		}
		return true
	})
	// Redis counts again.
	ks := h.store.Keyspace()
	for sec := from.Unix(); sec <= to.Unix(); sec++ {
		if err := h.rdb.Del(context.Background(), ks.LapsesKey(sec)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, waitLong+testGrace, "the blip's guides, a grace late", func() bool {
		by := byUID(h.events())
		for uid := range crowd {
			if len(by[uid]) == 0 {
				return false
			}
		}
		return true
	})

	// Well past any window the blip's lapses could be counted in.
	h.untilRedis(to.Add(window + time.Second))
	h.sweptPast(h.redisNow())
	start := h.redisNow()
	later := map[string]grant{}
	for i := range 6 {
		uid := fmt.Sprintf("later-%d", i)
		later[uid] = h.renew(uid, "one", 500*time.Millisecond)
	}
	waitFor(t, waitLong+testGrace+releaseSlack, "the 6 later silences' guides", func() bool {
		by := byUID(h.events())
		for uid := range later {
			if len(by[uid]) == 0 {
				return false
			}
		}
		return true
	})
	h.sweptPast(h.redisNow())
	by := byUID(h.events())
	checkStorm(t, by, later)
	counted := h.lapsesCounted(start.Add(-window), h.redisNow())
	late := 0
	for uid := range later {
		ev := by[uid][0]
		if d := time.Duration(ev.DetectedMS-ev.DeadlineMS) * time.Millisecond; d >= testGrace-250*time.Millisecond {
			late++
			t.Errorf("%s guided %v after its deadline: held by the brake, though 6 lapsed in its window (counted there: %d, the blip's 45 carried in from %v before)",
				uid, d, counted, start.Sub(last).Round(time.Second))
		}
	}
	if late == 0 && counted != len(later) {
		t.Errorf("the window of the 6 later silences counts %d lapses, want 6", counted)
	}
}

// pauseWritesSingle makes the harness's one Redis hold every write
// (scripts included) for d, as a graceful failover does on the master it
// demotes.
func (h *harness) pauseWritesSingle(d time.Duration) {
	h.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: h.srv.Addr})
	defer c.Close()
	if err := c.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "WRITE").Err(); err != nil {
		h.t.Fatal(err)
	}
}

// TestAttackCountLateMissesEarlierShare: lapses are counted into the
// second the count runs in (8ed727c), not the second they were found in.
// Two replicas find one crowd of 90 (45 each, deadlines within ms of each
// other) in the same sweep round, at a threshold of 50 in a window of 2 s.
// B claims and counts its 45 at once. A's claims, sent just after, meet
// Redis holding writes for 2.2 s (a graceful failover's pause; under the
// client's 3 s timeout), so A counts 2.2 s after it found its share, into
// a second whose window no longer holds B's: each count sees 45, and all
// 90 go out at once. With the default window of 10 s the same takes a
// count 10 s after its mark (a starved or paused process, the claims of a
// storm's batch on a slow Redis). The brake lets out the first lapses of
// a window up to its threshold, and no more.
func TestAttackCountLateMissesEarlierShare(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.brakePolicy()
	cfgA, cfgB := h.brakeConfig(ModeSweep), h.brakeConfig(ModeSweep)
	for _, c := range []*Config{&cfgA, &cfgB} {
		c.PrefetchInterval = 0
		c.MassExpiryWindow = 2 * time.Second
	}
	a, b := h.openIdle(cfgA), h.openIdle(cfgB)
	ctx := context.Background()

	uids := make([]string, 90)
	for i := range uids {
		uids[i] = fmt.Sprintf("late-%02d", i)
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
	dueA, dueB := due[:45], due[45:]

	// Both mark in the same sweep round ...
	cA, err := a.marker.mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cB, err := b.marker.mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// ... B claims and counts its share at once ...
	if _, err := b.emit(ctx, cB, dueB, timeoutevent.SourceSweep); err != nil {
		t.Fatal(err)
	}
	// ... and A's claims wait out a write pause.
	h.pauseWritesSingle(2200 * time.Millisecond)
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
	if threshold := cfgA.MassExpiryFloor; out > threshold {
		t.Errorf("%d of a crowd of %d found together let out at once, %d held, at a threshold of %d in a window of %v: A counted its share %v after its mark, into a window without B's",
			out, len(crowd), len(crowd)-out, threshold, cfgA.MassExpiryWindow, h.redisNow().Sub(cA.Now).Round(100*time.Millisecond))
	}
}
