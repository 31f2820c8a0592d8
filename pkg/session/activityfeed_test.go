package session

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestActivityWatermark checks the feed's watermark as the listener reads
// it in each mark: each partition's time moves only forward, the earliest
// partition's is the watermark, a step past the gap is a blind interval
// of everyone, and an operator can forget the feed.
func TestActivityWatermark(t *testing.T) {
	s, ctx := newStore(t)
	mark := func() Control {
		t.Helper()
		c, err := s.Mark(ctx, SweepMark{Keep: time.Hour, GapMax: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := mark(); c.ActivityStamp != 0 {
		t.Fatalf("stamp interval %v before any activity consumer ran", c.ActivityStamp)
	} else if _, fed := c.ActivityWatermark(); fed {
		t.Fatal("a watermark before any activity consumer ran")
	}
	now, err := s.ActivityClock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const gap = 2 * time.Second
	caughtUp := func(parts map[int32]time.Time) {
		t.Helper()
		if _, err := s.ActivityCaughtUp(ctx, FeedStamp{Gap: gap, CaughtUp: parts}); err != nil {
			t.Fatal(err)
		}
	}
	t0 := now.Truncate(time.Millisecond)
	caughtUp(map[int32]time.Time{0: t0, 1: t0.Add(-time.Second), 2: t0})
	if w, fed := mark().ActivityWatermark(); !fed || !w.Equal(t0.Add(-time.Second)) {
		t.Fatalf("watermark = %v %v, want the earliest partition's, %v", w, fed, t0.Add(-time.Second))
	}
	// A consumer that lost partition 1 in a rebalance stamps late: no change.
	caughtUp(map[int32]time.Time{1: t0.Add(-2 * time.Second)})
	caughtUp(map[int32]time.Time{1: t0.Add(500 * time.Millisecond)})
	c := mark()
	if w, _ := c.ActivityWatermark(); !w.Equal(t0) {
		t.Fatalf("watermark = %v, want %v", w, t0)
	}
	if len(c.Blind) != 0 {
		t.Fatalf("blind intervals %+v from steps within the gap", c.Blind)
	}
	// Partition 2 lagged 3 s (Kafka down, or its consumer): a blind interval.
	caughtUp(map[int32]time.Time{2: t0.Add(3 * time.Second)})
	c = mark()
	want := BlindInterval{Start: t0, End: t0.Add(3 * time.Second), Reason: BlindActivityLag}
	if len(c.Blind) != 1 || c.Blind[0] != want {
		t.Fatalf("blind intervals = %+v, want %+v", c.Blind, want)
	}
	// The topic's partitions: a fourth, just added and stamped by nobody,
	// holds every deadline; the topic made smaller drops it again.
	stamp := func(st FeedStamp) {
		t.Helper()
		if _, err := s.ActivityCaughtUp(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	stamp(FeedStamp{Gap: gap, Topic: "acts", Partitions: 4})
	if w, _ := mark().ActivityWatermark(); w.UnixMilli() != 0 {
		t.Fatalf("watermark %v with a partition nobody stamped, want the epoch: hold everything", w)
	}
	stamp(FeedStamp{Gap: gap, Topic: "acts", Partitions: 3})
	if c := mark(); len(c.Activity) != 3 {
		t.Fatalf("partitions %v after the topic shrank to 3", c.Activity)
	}
	// A stamp that is a partition's first (from 0) is no lag.
	stamp(FeedStamp{Gap: gap, Topic: "acts", Partitions: 4, CaughtUp: map[int32]time.Time{3: t0.Add(4 * time.Second)}})
	if c := mark(); len(c.Blind) != 1 {
		t.Fatalf("blind intervals %+v: a first stamp recorded a lag", c.Blind)
	}
	// The stamp interval a member says is kept beside the partitions, the
	// last said winning; a stamp that does not say it, or only reads the
	// clock, leaves it.
	if c := mark(); c.ActivityStamp != 0 {
		t.Fatalf("stamp interval %v, none said", c.ActivityStamp)
	}
	again := map[int32]time.Time{3: t0.Add(4 * time.Second)} // no step
	stamp(FeedStamp{Gap: gap, Every: 300 * time.Millisecond, CaughtUp: again})
	stamp(FeedStamp{Gap: gap, Every: 250 * time.Millisecond, CaughtUp: again})
	stamp(FeedStamp{Gap: gap, CaughtUp: again})
	if _, err := s.ActivityClock(ctx); err != nil {
		t.Fatal(err)
	}
	if c := mark(); c.ActivityStamp != 250*time.Millisecond || len(c.Activity) != 4 {
		t.Fatalf("stamp interval %v, partitions %v; want 250ms, 4 partitions", c.ActivityStamp, c.Activity)
	}
	// Another topic's watermark is dropped whole, its stamp interval too
	// unless the member says it again.
	stamp(FeedStamp{Gap: gap, Topic: "acts-v2", Partitions: 2, CaughtUp: map[int32]time.Time{0: t0.Add(5 * time.Second), 1: t0.Add(5 * time.Second)}})
	if c := mark(); len(c.Activity) != 2 || !c.Activity[0].Equal(t0.Add(5*time.Second)) || c.ActivityStamp != 0 {
		t.Fatalf("partitions %v, stamp interval %v after the move to a topic of 2", c.Activity, c.ActivityStamp)
	}
	stamp(FeedStamp{Gap: gap, Topic: "acts-v2", Partitions: 2, Every: time.Second})
	if c := mark(); len(c.Activity) != 2 || c.ActivityStamp != time.Second {
		t.Fatalf("partitions %v, stamp interval %v; want 2, 1s", c.Activity, c.ActivityStamp)
	}
	if err := s.ForgetActivity(ctx); err != nil {
		t.Fatal(err)
	}
	if _, fed := mark().ActivityWatermark(); fed {
		t.Fatal("a watermark after the feed was forgotten")
	}
}

// FuzzParseActivity: the watermark hash as HGETALL gives it, any fields
// and values: never a panic, and only a numeric partition with a time
// from 0 on is read; the topic and stamp fields are not partitions; a
// stamp interval is read only from the stamp field, a whole number of ms
// from 1 to a minute, as written.
func FuzzParseActivity(f *testing.F) {
	f.Add("0", "1795255600123", "topic", "session-activity")
	f.Add("-1", "5", "3", "-7")
	f.Add("2147483648", "1", "x", "")
	f.Add("stamp", "250", "0", "1795255600123")
	f.Add("stamp", "-250", "stamp", "60001")
	f.Add("1", "0", "stamp", "1e3")
	f.Fuzz(func(t *testing.T, f1, v1, f2, v2 string) {
		got, stamp := parseActivity([]any{f1, v1, f2, v2})
		for p, w := range got {
			if p < 0 || w.UnixMilli() < 0 {
				t.Fatalf("parseActivity(%q %q %q %q) read partition %d at %v", f1, v1, f2, v2, p, w)
			}
		}
		for p := range got {
			n1, err1 := strconv.ParseInt(f1, 10, 32)
			n2, err2 := strconv.ParseInt(f2, 10, 32)
			if !(err1 == nil && int32(n1) == p) && !(err2 == nil && int32(n2) == p) {
				t.Fatalf("partition %d read from fields %q and %q", p, f1, f2)
			}
		}
		// The stamp interval: the last stamp field that holds one.
		var want time.Duration
		for _, fv := range [][2]string{{f1, v1}, {f2, v2}} {
			if fv[0] != activityStampField {
				continue
			}
			if ms, err := strconv.ParseInt(fv[1], 10, 64); err == nil && ms >= 1 && ms <= 60_000 {
				want = time.Duration(ms) * time.Millisecond
			}
		}
		if stamp != want {
			t.Fatalf("parseActivity(%q %q %q %q) read stamp interval %v, want %v", f1, v1, f2, v2, stamp, want)
		}
	})
}

// TestActivityLagEndsAtTheStamp: a member reads Redis's clock, then asks
// Kafka for the partitions' ends, which blocks while Kafka is down; the
// time it stamps is then inside the outage. The blind interval of the
// step ends when the stamp is written, not at that time: until then, the
// feed had read nothing.
func TestActivityLagEndsAtTheStamp(t *testing.T) {
	s, ctx := newStore(t)
	now, err := s.ActivityClock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const gap = time.Second
	cur := now.Add(-20 * time.Second)
	if _, err := s.ActivityCaughtUp(ctx, FeedStamp{Gap: gap, CaughtUp: map[int32]time.Time{0: cur}}); err != nil {
		t.Fatal(err)
	}
	// Read at cur+10s, inside the outage; written now.
	written, err := s.ActivityCaughtUp(ctx, FeedStamp{Gap: gap, CaughtUp: map[int32]time.Time{0: cur.Add(10 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Mark(ctx, SweepMark{Keep: time.Hour, GapMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	want := BlindInterval{Start: cur, End: written, Reason: BlindActivityLag}
	if len(c.Blind) != 1 || c.Blind[0] != want {
		t.Fatalf("blind intervals = %+v, want %+v: from the last stamp to when this one was written", c.Blind, want)
	}
	if w, _ := c.ActivityWatermark(); !w.Equal(cur.Add(10 * time.Second)) {
		t.Fatalf("watermark = %v, want the stamped time %v", w, cur.Add(10*time.Second))
	}
}

// TestActivityFeedStarting: a feed member marks, before it has read
// anything, that a feed exists: until partitions are known and stamped,
// the watermark is the epoch and holds every deadline, as an unstamped
// partition does. Forgetting the feed releases that too; once partitions
// are in the hash, the mark changes nothing.
func TestActivityFeedStarting(t *testing.T) {
	s, ctx := newStore(t)
	watermark := func() (time.Time, bool) {
		t.Helper()
		c, err := s.Mark(ctx, SweepMark{Keep: time.Hour, GapMax: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return c.ActivityWatermark()
	}
	starting := func() {
		t.Helper()
		if err := s.ActivityFeedStarting(ctx); err != nil {
			t.Fatal(err)
		}
	}
	starting()
	if w, fed := watermark(); !fed || w.UnixMilli() != 0 {
		t.Fatalf("watermark = %v %v of a feed that never stamped, want the epoch: hold everything", w, fed)
	}
	c, err := s.ActivityControl(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !c.ActivityUnstamped || len(c.Activity) != 0 {
		t.Fatalf("operator's look: unstamped %v, partitions %v; want a feed that never stamped", c.ActivityUnstamped, c.Activity)
	}
	if err := s.ForgetActivity(ctx); err != nil {
		t.Fatal(err)
	}
	if w, fed := watermark(); fed {
		t.Fatalf("watermark %v after the feed was forgotten", w)
	}

	starting()
	now, err := s.ActivityClock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := now.Truncate(time.Millisecond)
	stamp := func(st FeedStamp) {
		t.Helper()
		st.Gap = time.Second
		if _, err := s.ActivityCaughtUp(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	stamp(FeedStamp{Topic: "acts", Partitions: 2, CaughtUp: map[int32]time.Time{0: t0}})
	if w, fed := watermark(); !fed || w.UnixMilli() != 0 {
		t.Fatalf("watermark = %v %v with partition 1 not stamped, want the epoch", w, fed)
	}
	stamp(FeedStamp{CaughtUp: map[int32]time.Time{1: t0}})
	if w, fed := watermark(); !fed || !w.Equal(t0) {
		t.Fatalf("watermark = %v %v with both partitions stamped, want %v", w, fed, t0)
	}
	// Another member starting changes nothing of a feed that stamped.
	starting()
	if w, fed := watermark(); !fed || !w.Equal(t0) {
		t.Fatalf("watermark = %v %v after another member started, want %v", w, fed, t0)
	}
	if lags := activityLags(t, s, ctx); len(lags) != 0 {
		t.Fatalf("a first stamp soon after the start recorded lags %v", lags)
	}

	// A feed whose first stamp comes more than the gap after its start
	// (Kafka out of reach from then) lagged from the start: the records
	// the platform could not produce meanwhile come after.
	if err := s.ForgetActivity(ctx); err != nil {
		t.Fatal(err)
	}
	starting()
	c, err = s.ActivityControl(ctx)
	if err != nil {
		t.Fatal(err)
	}
	started := c.Now.Truncate(time.Millisecond)
	late := started.Add(3 * time.Second)
	stamp(FeedStamp{Topic: "acts", Partitions: 1, CaughtUp: map[int32]time.Time{0: late}})
	lags := activityLags(t, s, ctx)
	if len(lags) != 1 || lags[0].Start.After(started) || started.Sub(lags[0].Start) > time.Second || lags[0].End.Before(late) {
		t.Fatalf("a first stamp 3s after the start, gap 1s: lags %v, want one from the start (just before %v) to at least %v", lags, started, late)
	}
	if c, err = s.ActivityControl(ctx); err != nil || c.ActivityUnstamped {
		t.Fatalf("the start's mark after the first stamp: %v %v, want it gone", c.ActivityUnstamped, err)
	}
}

// activityLags reads the activity-lag blind intervals recorded.
func activityLags(t *testing.T, s *Store, ctx context.Context) []BlindInterval {
	t.Helper()
	c, err := s.Mark(ctx, SweepMark{Keep: time.Hour, GapMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var lags []BlindInterval
	for _, b := range c.Blind {
		if b.Reason == BlindActivityLag {
			lags = append(lags, b)
		}
	}
	return lags
}
