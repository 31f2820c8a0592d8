package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// score is uid's deadline in the index, or zero when it has none.
func score(t testing.TB, s *Store, uid string) time.Time {
	t.Helper()
	v, err := s.rdb.ZScore(context.Background(), s.ks.IndexKey(Bucket(uid)), uid).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}
	}
	if err != nil {
		t.Fatal(err)
	}
	return time.UnixMilli(int64(v))
}

// apply applies events and fails the test on an error.
func apply(t testing.TB, s *Store, events ...Activity) ActivityResult {
	t.Helper()
	res, err := s.ApplyActivity(context.Background(), "gw-a", SegmentRules{}, events)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func ev(uid string, kind ActivityKind, ttl time.Duration) Activity {
	return Activity{UID: uid, Kind: kind, TTL: ttl}
}

func (a Activity) at(at time.Time) Activity              { a.At = at; return a }
func (a Activity) clock(c Clock) Activity                { a.Clock = c; return a }
func (a Activity) hold(d time.Duration) Activity         { a.MaxHold = d; return a }
func (a Activity) segment(seg string) Activity           { a.Segment = seg; return a }
func (a Activity) jitterOf(d time.Duration) Activity     { a.Jitter = d; return a }
func near(got, want time.Time, slack time.Duration) bool { return got.Sub(want).Abs() <= slack }

// TestActivityOutcomes: what each kind of event, and a renewal after it,
// does to the deadline and the turn state, by the script's table of
// rules. Deadlines are compared with Redis's clock at the step, to a
// slack a busy machine may add between the script's read of it and ours.
func TestActivityOutcomes(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	const slack = 2 * time.Second
	type step struct {
		events []Activity
		renew  Clock         // with events nil: a ping on this clock
		ago    time.Duration // events at Redis's now less this (0: no time)
		again  bool          // events at the times of the step before's: resent
		// wantOffset is the deadline's offset from Redis's now after the
		// step; wantNone: no index entry.
		wantOffset time.Duration
		wantNone   bool
		applied    int
		stale      int
		wantTurn   string // "user", "us", "" (none)
	}
	hour := time.Hour
	cases := []struct {
		name  string
		steps []step
	}{
		{"active creates a session", []step{
			{events: []Activity{ev("u", ActivityActive, ttl)}, wantOffset: ttl, applied: 1},
		}},
		{"turn to us parks for the max hold", []step{
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(hour)}, wantOffset: hour + ttl, applied: 1, wantTurn: "us"},
			{renew: ClockPresence, wantOffset: hour + ttl, wantTurn: "us"},
			{events: []Activity{ev("u", ActivityActive, ttl)}, wantOffset: hour + ttl, applied: 1, wantTurn: "us"},
		}},
		{"turn to us without a max hold holds MaxTurnHold", []step{
			{events: []Activity{ev("u", ActivityTurnUs, ttl)}, wantOffset: MaxTurnHold + ttl, applied: 1, wantTurn: "us"},
		}},
		{"turn to the user ends the park", []step{
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(hour)}, wantOffset: hour + ttl, applied: 1, wantTurn: "us"},
			{events: []Activity{ev("u", ActivityTurnUser, ttl)}, wantOffset: ttl, applied: 1, wantTurn: "user"},
			{renew: ClockPresence, wantOffset: ttl, wantTurn: "user"},
		}},
		{"turn to the user keeps a longer grant of another device", []step{
			{events: []Activity{ev("u", ActivityActive, hour)}, wantOffset: hour, applied: 1},
			{events: []Activity{ev("u", ActivityTurnUser, ttl)}, wantOffset: hour, applied: 1, wantTurn: "user"},
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(2 * hour)}, wantOffset: 2*hour + ttl, applied: 1, wantTurn: "us"},
			{events: []Activity{ev("u", ActivityTurnUser, ttl)}, wantOffset: ttl, applied: 1, wantTurn: "user"},
		}},
		{"the turn clock parks until the first turn to the user", []step{
			{renew: ClockTurn, wantOffset: MaxTurnHold + ttl},
			{events: []Activity{ev("u", ActivityActive, ttl).clock(ClockTurn)}, wantOffset: MaxTurnHold + ttl, applied: 1},
			{events: []Activity{ev("u", ActivityTurnUser, ttl).clock(ClockTurn)}, wantOffset: ttl, applied: 1, wantTurn: "user"},
			{renew: ClockTurn, wantOffset: ttl, wantTurn: "user"},
			{events: []Activity{ev("u", ActivityTurnUs, ttl).clock(ClockTurn).hold(hour)}, wantOffset: hour + ttl, applied: 1, wantTurn: "us"},
		}},
		// From the hold's end, as a turn to the user then: an event that
		// reaches us late does not start its silence late.
		{"a max hold that ended runs the clock from its end", []step{
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(time.Second)}, ago: 10 * time.Second, wantOffset: ttl - 9*time.Second, applied: 1, wantTurn: "us"},
			{renew: ClockPresence, wantOffset: ttl, wantTurn: "us"},
		}},
		// A resend applied late, after the first copy (its own time, the
		// turn's in force): stale, the same deadline. A turn of a later
		// time applies. (Each once ran 30 s before its step: two steps
		// within one ms made the second a resend, stale, and the case
		// failed on a fast machine.)
		{"a turn to us applied again after its hold ended", []step{
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(time.Second)}, ago: 30 * time.Second, wantOffset: ttl - 29*time.Second, applied: 1, wantTurn: "us"},
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(time.Second)}, again: true, wantOffset: ttl - 29*time.Second, stale: 1, wantTurn: "us"},
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(time.Second)}, ago: 20 * time.Second, wantOffset: ttl - 19*time.Second, applied: 1, wantTurn: "us"},
		}},
		{"a turn to us whose silence was over by the time it came is stale", []step{
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(time.Second)}, ago: ttl + 10*time.Second, wantNone: true, stale: 1},
		}},
		{"a turn older than the stored one is stale", []step{
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(hour)}, wantOffset: hour + ttl, applied: 1, wantTurn: "us"},
			{events: []Activity{ev("u", ActivityTurnUser, ttl)}, ago: time.Minute, wantOffset: hour + ttl, stale: 1, wantTurn: "us"},
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(2 * hour)}, ago: time.Minute, wantOffset: hour + ttl, stale: 1, wantTurn: "us"},
		}},
		{"active older than the last renewal is stale", []step{
			{renew: ClockPresence, wantOffset: ttl},
			{events: []Activity{ev("u", ActivityActive, 2*hour)}, ago: time.Minute, wantOffset: ttl, stale: 1},
		}},
		{"end ends the session and its turn", []step{
			{events: []Activity{ev("u", ActivityTurnUs, ttl)}, wantOffset: MaxTurnHold + ttl, applied: 1, wantTurn: "us"},
			{events: []Activity{{UID: "u", Kind: ActivityEnd}}, wantNone: true, applied: 1},
			{renew: ClockPresence, wantOffset: ttl},
		}},
		{"an end older than the last renewal is stale", []step{
			{renew: ClockPresence, wantOffset: ttl},
			{events: []Activity{{UID: "u", Kind: ActivityEnd}}, ago: time.Minute, wantOffset: ttl, stale: 1},
		}},
		{"one user's events apply in the order given", []step{
			{events: []Activity{ev("u", ActivityTurnUs, ttl).hold(hour), ev("u", ActivityTurnUser, ttl)}, wantOffset: ttl, applied: 2, wantTurn: "user"},
			{events: []Activity{ev("u", ActivityTurnUser, ttl), ev("u", ActivityTurnUs, ttl).hold(hour)}, wantOffset: hour + ttl, applied: 2, wantTurn: "us"},
			{events: []Activity{ev("u", ActivityActive, ttl), {UID: "u", Kind: ActivityEnd}}, wantNone: true, applied: 2},
			{events: []Activity{{UID: "u", Kind: ActivityEnd}, ev("u", ActivityActive, ttl)}, wantOffset: ttl, applied: 2},
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			uid := fmt.Sprintf("case%d", i)
			var last []Activity // the step before's events
			for n, st := range tc.steps {
				now := redisNow(t, s.rdb)
				var res ActivityResult
				if st.events == nil {
					if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, st.renew); err != nil {
						t.Fatal(err)
					}
				} else {
					evs := make([]Activity, len(st.events))
					for j, e := range st.events {
						e.UID = uid
						switch {
						case st.again:
							e.At = last[j].At
						case st.ago > 0:
							e.At = now.Add(-st.ago)
						}
						evs[j] = e
					}
					last = evs
					res = apply(t, s, evs...)
				}
				if res.Applied != st.applied || res.Stale != st.stale {
					t.Fatalf("step %d: %+v, want %d applied, %d stale", n, res, st.applied, st.stale)
				}
				got := score(t, s, uid)
				live, err := s.Live(ctx, uid)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case st.wantNone && (!got.IsZero() || live):
					t.Fatalf("step %d: deadline %v, live %v; want no session", n, got, live)
				case !st.wantNone && (!near(got, now.Add(st.wantOffset), slack) || !live):
					t.Fatalf("step %d: deadline %v from now (live %v), want %v", n, got.Sub(now), live, st.wantOffset)
				}
				if !st.wantNone {
					// The session key lives as long as the deadline.
					pttl, err := s.rdb.PTTL(ctx, s.ks.SessionKey(uid)).Result()
					if err != nil || !near(now.Add(pttl), got, slack) {
						t.Fatalf("step %d: session key PTTL %v, %v; want to the deadline %v", n, pttl, err, got.Sub(now))
					}
				}
				turn, ok, err := s.Turn(ctx, uid)
				if err != nil {
					t.Fatal(err)
				}
				whose := ""
				if ok {
					whose = map[bool]string{true: "us", false: "user"}[turn.Ours]
					// It lives as long as the session's keys.
					pttl, err := s.rdb.PTTL(ctx, s.ks.TurnKey(uid)).Result()
					if err != nil || pttl <= RenewedKeep-slack {
						t.Fatalf("step %d: turn key PTTL %v, %v; want past the deadline by RenewedKeep", n, pttl, err)
					}
				}
				if whose != st.wantTurn {
					t.Fatalf("step %d: turn %q (%+v), want %q", n, whose, turn, st.wantTurn)
				}
			}
		})
	}
}

// TestActivityRefusesBadBatches: a batch with a bad event is refused
// whole, naming the event, and nothing of it applies.
func TestActivityRefusesBadBatches(t *testing.T) {
	s, ctx := newStore(t)
	good := ev("good", ActivityActive, time.Minute)
	for _, tc := range []struct {
		bad  Activity
		want string
	}{
		{ev("", ActivityActive, time.Minute), "uid"},
		{ev("a b", ActivityActive, time.Minute), "uid"},
		{ev("x", "typing", time.Minute), "kind"},
		{ev("x", ActivityActive, -time.Second), "ttl"},
		{ev("x", ActivityActive, 0).jitterOf(-time.Second), "jitter"},
		{ev("x", ActivityActive, time.Minute).clock("sundial"), "clock"},
		{ev("x", ActivityTurnUs, time.Minute).hold(MaxTurnHold + time.Millisecond), "max hold"},
		{ev("x", ActivityTurnUs, time.Minute).hold(-time.Second), "max hold"},
		{ev("x", ActivityActive, time.Minute).hold(time.Second), "max hold"},
		{ev("x", ActivityActive, time.Minute).segment("a b"), "segment"},
	} {
		_, err := s.ApplyActivity(ctx, "gw", SegmentRules{}, []Activity{good, tc.bad})
		if err == nil || !strings.Contains(err.Error(), "event 1") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want a refusal of event 1 naming %s", tc.bad, err, tc.want)
		}
	}
	if live, err := s.Live(ctx, "good"); err != nil || live {
		t.Fatalf("a refused batch applied its good event: live %v, %v", live, err)
	}
	// An event of no TTL needs rules that give one.
	if _, err := s.ApplyActivity(ctx, "gw", SegmentRules{}, []Activity{ev("x", ActivityActive, 0)}); err == nil || !strings.Contains(err.Error(), "rules") {
		t.Errorf("an event of no TTL without rules: %v, want a refusal naming the rules", err)
	}
	// An end needs no TTL.
	if res := apply(t, s, Activity{UID: "good", Kind: ActivityEnd}); res.Applied != 1 {
		t.Fatalf("end: %+v", res)
	}
}

// TestActivitySegment: an event without a segment is of the user's
// session's, else of the default; one of no TTL is granted its
// segment's by the rules, as the script resolves the segment, plus its
// jitter: what SegmentRules.Of says for the segment the session is in.
// The segments of the events that turned come back for their timeline.
func TestActivitySegment(t *testing.T) {
	s, ctx := newStore(t)
	rules := SegmentRules{
		Segments: map[string]SegmentRule{
			"vip":          {TTL: 3 * time.Hour, Clock: ClockPresence},
			DefaultSegment: {TTL: 2 * time.Hour, Clock: ClockPresence},
			"slow":         {TTL: 4 * time.Hour, Clock: ClockTurn},
		},
		Unlisted: SegmentRule{TTL: time.Hour, Clock: ClockPresence},
	}
	for uid, seg := range map[string]string{"vipper": "vip", "other": "other", "turner": "slow"} {
		if _, err := s.Renew(ctx, uid, seg, time.Minute, ClockPresence); err != nil {
			t.Fatal(err)
		}
	}
	const jitter = 7*time.Minute + 1500*time.Microsecond
	const slack = 2 * time.Second
	for _, tc := range []struct {
		name, uid, given string
		want             string        // the segment after
		offset           time.Duration // the deadline's, from now
	}{
		{"listed", "vipper", "", "vip", 3*time.Hour + jitter},
		{"not listed: the unlisted rule", "other", "", "other", time.Hour + jitter},
		{"no session: the default segment's rule, not the unlisted", "nobody", "", DefaultSegment, 2*time.Hour + jitter},
		{"the rule's clock: the turn clock parks", "turner", "", "slow", MaxTurnHold + 4*time.Hour + jitter},
		{"a segment given", "named", "vip", "vip", 3*time.Hour + jitter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := redisNow(t, s.rdb)
			if res, err := s.ApplyActivity(ctx, "gw", rules, []Activity{ev(tc.uid, ActivityActive, 0).segment(tc.given).jitterOf(jitter)}); err != nil || res.Applied != 1 {
				t.Fatalf("%+v, %v", res, err)
			}
			seg, err := s.rdb.HGet(ctx, s.ks.SegmentsKey(Bucket(tc.uid)), tc.uid).Result()
			if err != nil || seg != tc.want {
				t.Fatalf("segment %q, %v; want %q", seg, err, tc.want)
			}
			got := score(t, s, tc.uid)
			if !near(got, now.Add(tc.offset), slack) {
				t.Fatalf("deadline %v from now, want %v", got.Sub(now), tc.offset)
			}
			// What the Go side resolves for the same segment.
			r := rules.Of(seg)
			want := r.TTL + jitter
			if r.Clock == ClockTurn {
				want += MaxTurnHold
			}
			if !near(got, now.Add(want), slack) {
				t.Fatalf("deadline %v from now, the Go rule of %q says %v", got.Sub(now), seg, want)
			}
		})
	}

	// The turns' segments, as resolved, for the timeline: an end reads
	// the segment it removes.
	res, err := s.ApplyActivity(ctx, "gw", rules, []Activity{
		ev("vipper", ActivityTurnUser, 0),
		ev("other", ActivityActive, 0),
		{UID: "other", Kind: ActivityEnd},
		{UID: "gone", Kind: ActivityEnd},
		ev("named", ActivityTurnUs, 0).segment("sales"),
	})
	if err != nil || res.Applied != 5 {
		t.Fatalf("%+v, %v", res, err)
	}
	if fmt.Sprint(res.Turned) != "[0 2 3 4]" {
		t.Fatalf("turned %v", res.Turned)
	}
	want := map[int]string{0: "vip", 2: "other", 3: DefaultSegment, 4: "sales"}
	if fmt.Sprint(res.Segments) != fmt.Sprint(want) {
		t.Fatalf("segments of the turns %v, want %v", res.Segments, want)
	}
}

// TestSegmentRulesOf: the Go lookup of a segment's rule, which the
// script mirrors: listed, else the unlisted rule; "" is DefaultSegment.
func TestSegmentRulesOf(t *testing.T) {
	r := SegmentRules{
		Segments: map[string]SegmentRule{"vip": {TTL: 3 * time.Second}, DefaultSegment: {TTL: 2 * time.Second}},
		Unlisted: SegmentRule{TTL: time.Second, Clock: ClockTurn},
	}
	for seg, want := range map[string]time.Duration{"vip": 3 * time.Second, DefaultSegment: 2 * time.Second, "": 2 * time.Second, "other": time.Second} {
		if got := r.Of(seg).TTL; got != want {
			t.Errorf("Of(%q) = %v, want %v", seg, got, want)
		}
	}
}

// confirmNotDue asks the listener's confirmation (dueScript by Redis's
// clock, as a prefetched timer that fired does) and the consumer's check
// about uid, and fails if either finds it due.
func confirmNotDue(t *testing.T, s *Store, uid string) {
	t.Helper()
	ctx := context.Background()
	got, _, err := s.Confirm(ctx, []Candidate{{UID: uid}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Due) != 0 || len(got.NotDue) != 1 || !got.NotDue[0].InIndex || got.NotDue[0].Index <= got.Now {
		t.Fatalf("confirm of %s: %+v, want not due, still in the index, later", uid, got)
	}
	due, _, err := s.Due(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range due {
		if e.UID == uid {
			t.Fatalf("the sweep found %s due: %+v", uid, e)
		}
	}
	if c, err := s.Check(ctx, uid); err != nil || !c.Live {
		t.Fatalf("check of %s: %+v, %v; want live", uid, c, err)
	}
}

// TestTurnHoldsThroughPings: a turn to us holds the clock through three
// TTLs while the user's pings flow and a resync restores an old grant;
// neither the sweep nor a confirmation finds the session due. A turn to
// the user then starts the clock: the silence is due a TTL later, not
// before.
func TestTurnHoldsThroughPings(t *testing.T) {
	for _, clock := range []Clock{ClockPresence, ClockTurn} {
		t.Run(string(clock), func(t *testing.T) {
			s, ctx := newStore(t)
			const ttl = 200 * time.Millisecond
			r := NewRenewer(s, RenewerConfig{Instance: "gw-a"})
			rctx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { r.Run(rctx); close(done) }()
			defer func() { stop(); <-done }()

			if clock == ClockTurn {
				// On the turn clock, pings alone hold until a first turn.
				if _, err := r.Renew(ctx, "ann", DefaultSegment, ttl, clock); err != nil {
					t.Fatal(err)
				}
			} else {
				apply(t, s, ev("ann", ActivityTurnUs, ttl).clock(clock))
			}
			end := redisNow(t, s.rdb).Add(3 * ttl)
			for redisNow(t, s.rdb).Before(end) {
				if _, err := r.Renew(ctx, "ann", DefaultSegment, ttl, clock); err != nil {
					t.Fatal(err)
				}
				// An old grant restored after an outage does not un-park.
				if _, err := r.Resync(ctx, []Grant{{UID: "ann", Segment: DefaultSegment, Left: ttl / 2, Ago: ttl / 2, Clock: clock}}); err != nil {
					t.Fatal(err)
				}
				confirmNotDue(t, s, "ann")
				time.Sleep(ttl / 4) // the ping period: real time must pass for the TTL to
			}
			// Past three TTLs of pings: still parked.
			redisPast(t, s.rdb, end.Add(ttl))
			confirmNotDue(t, s, "ann")

			res := apply(t, s, ev("ann", ActivityTurnUser, ttl).clock(clock))
			turned := redisNow(t, s.rdb)
			if res.Applied != 1 {
				t.Fatalf("turn to the user: %+v", res)
			}
			deadline := score(t, s, "ann")
			if !near(deadline, turned.Add(ttl), 100*time.Millisecond) {
				t.Fatalf("after the turn to the user the deadline is %v from now, want the TTL %v", deadline.Sub(turned), ttl)
			}
			got := dueOne(t, s, "ann", 5*time.Second, sweepAll(s))
			if got.Stage != 1 || !got.Deadline.Equal(deadline) || got.Via != "gw-a" {
				t.Fatalf("the silence after the turn: %+v, want stage 1 at %v via gw-a", got, deadline)
			}
			if redisNow(t, s.rdb).Before(deadline) {
				t.Fatal("due before its deadline")
			}
		})
	}
}

// TestMaxHoldRunsTheClock: a turn to us that the platform never passes
// back holds until its max hold, and the clock runs from then: the
// silence is due the TTL after it.
func TestMaxHoldRunsTheClock(t *testing.T) {
	s, ctx := newStore(t)
	const ttl, hold = 150 * time.Millisecond, 300 * time.Millisecond
	at := redisNow(t, s.rdb)
	apply(t, s, ev("bo", ActivityTurnUs, ttl).hold(hold).at(at))
	deadline := score(t, s, "bo")
	if want := at.Add(hold + ttl); !deadline.Equal(time.UnixMilli(want.UnixMilli())) {
		t.Fatalf("parked at %v, want the max hold's end plus the TTL %v", deadline, want)
	}
	// A ping within the hold keeps the park.
	if _, err := s.Renew(ctx, "bo", DefaultSegment, ttl, ClockPresence); err != nil {
		t.Fatal(err)
	}
	if got := score(t, s, "bo"); !got.Equal(deadline) {
		t.Fatalf("a ping moved the park from %v to %v", deadline, got)
	}
	redisPast(t, s.rdb, at.Add(hold+ttl/2))
	confirmNotDue(t, s, "bo")
	got := dueOne(t, s, "bo", 5*time.Second, sweepAll(s))
	if !got.Deadline.Equal(deadline) {
		t.Fatalf("due %+v, want the deadline %v", got, deadline)
	}
}

// TestEndCancelsStages: an end event between the stages of a silence
// cancels those left, as End does, and removes the turn state.
func TestEndCancelsStages(t *testing.T) {
	s, ctx := newStore(t)
	apply(t, s, ev("cy", ActivityTurnUser, 50*time.Millisecond))
	first := dueOne(t, s, "cy", 5*time.Second, sweepAll(s))
	first.NextDue = first.Due.Add(200 * time.Millisecond)
	if err := s.Settle(ctx, []Expired{first}); err != nil {
		t.Fatal(err)
	}
	if res := apply(t, s, Activity{UID: "cy", Kind: ActivityEnd}); res.Applied != 1 {
		t.Fatalf("end: %+v", res)
	}
	redisPast(t, s.rdb, first.NextDue)
	if got, _, err := s.Due(ctx, 100); err != nil || len(got) != 0 {
		t.Fatalf("after an end between stages: %+v, %v", got, err)
	}
	if n, _ := s.rdb.HLen(ctx, s.ks.StageKey(Bucket("cy"))).Result(); n != 0 {
		t.Fatalf("stage hash holds %d entries after the end", n)
	}
	if _, ok, err := s.Turn(ctx, "cy"); ok || err != nil {
		t.Fatalf("turn state after the end: %v, %v", ok, err)
	}
	if last, err := s.LastRenewed(ctx, "cy"); err != nil || last.Before(first.Deadline) {
		t.Fatalf("the end is not the last renewal: %v, %v", last, err)
	}
}

// TestActivityOnCluster: a batch over many buckets, on a 3-master
// cluster, one script call per bucket, applies every event, each user's
// in order.
func TestActivityOnCluster(t *testing.T) {
	s, ctx := newClusterStore(t)
	var events []Activity
	for i := range 200 {
		uid := fmt.Sprintf("c%03d", i)
		events = append(events, ev(uid, ActivityTurnUser, time.Minute), ev(uid, ActivityTurnUs, time.Minute).hold(time.Hour))
		if i%2 == 0 {
			events = append(events, ev(uid, ActivityTurnUser, time.Minute))
		}
	}
	res, err := s.ApplyActivity(ctx, "gw", SegmentRules{}, events)
	if err != nil || res.Applied != len(events) || res.Stale != 0 {
		t.Fatalf("%+v, %v; want %d applied", res, err, len(events))
	}
	if len(res.Turned) != len(events) {
		t.Fatalf("%d events changed the turn, want all %d: each turns it", len(res.Turned), len(events))
	}
	for i := range 200 {
		uid := fmt.Sprintf("c%03d", i)
		st, ok, err := s.Turn(ctx, uid)
		if err != nil || !ok || st.Ours != (i%2 == 1) {
			t.Fatalf("%s: turn %+v, %v, %v; want ours %v", uid, st, ok, err, i%2 == 1)
		}
	}
}

// BenchmarkApplyActivity applies batches of 1000 active events of
// distinct users: one script call per bucket, 64 in one pipeline.
func BenchmarkApplyActivity(b *testing.B) {
	s, ctx := newStoreTB(b)
	const batch = 1000
	events := make([]Activity, batch)
	b.ResetTimer()
	for n := 0; b.Loop(); n++ {
		for i := range events {
			events[i] = ev(fmt.Sprintf("u%06d", (n*batch+i)%200000), ActivityActive, time.Minute)
		}
		if _, err := s.ApplyActivity(ctx, "gw", SegmentRules{}, events); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
	// Redis's own time per event, apart from the client's and the
	// machine's other load: what bounds one Redis (or one master).
	reportRedisMicros(b, s.rdb, int64(b.N)*batch, "redis-µs/event")
}

// TestActivityTurned: the result names the events that changed whose
// turn it is, by their place in the batch, and not those that only
// repeated it or were stale.
func TestActivityTurned(t *testing.T) {
	s, _ := newStore(t)
	res := apply(t, s,
		ev("tt", ActivityTurnUser, time.Minute),
		ev("tt", ActivityTurnUser, time.Minute),
		ev("other", ActivityActive, time.Minute),
		ev("tt", ActivityTurnUs, time.Minute),
		ev("tt", ActivityTurnUs, time.Minute),
		ev("tt", ActivityEnd, time.Minute),
	)
	if fmt.Sprint(res.Turned) != "[0 3 5]" || res.Applied != 6 {
		t.Fatalf("%+v; want events 0, 3 and 5 turned, all 6 applied", res)
	}
	stale := apply(t, s, ev("tt", ActivityTurnUser, time.Minute).at(time.Now().Add(-time.Hour)))
	if stale.Stale != 1 || len(stale.Turned) != 0 {
		t.Fatalf("a stale turn: %+v, want stale and no turn", stale)
	}
}

// TestTurnToUsAgain: a turn to us after one to us replaces it, shorter
// or longer (queued for an hour, then an agent picks the chat up and
// types for at most 10 s): the clock runs once the latest one's max_ms
// is over. The park the first gave is not kept; a ping the user made
// meanwhile still gives its own TTL; and a turn to the user that ends
// our turn never guides sooner than a TTL after the user's last ping.
func TestTurnToUsAgain(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	const slack = 2 * time.Second

	shorter := "again-shorter"
	apply(t, s, ev(shorter, ActivityTurnUs, ttl).hold(time.Hour))
	apply(t, s, ev(shorter, ActivityTurnUs, ttl).hold(10*time.Second))
	now := redisNow(t, s.rdb)
	if d := score(t, s, shorter); !near(d, now.Add(10*time.Second+ttl), slack) {
		t.Errorf("a turn to us for 10 s after one for an hour: deadline in %v, want %v (the latest word)", d.Sub(now), 10*time.Second+ttl)
	}

	longer := "again-longer"
	apply(t, s, ev(longer, ActivityTurnUs, ttl).hold(10*time.Second))
	apply(t, s, ev(longer, ActivityTurnUs, ttl).hold(time.Hour))
	now = redisNow(t, s.rdb)
	if d := score(t, s, longer); !near(d, now.Add(time.Hour+ttl), slack) {
		t.Errorf("a turn to us for an hour after one for 10 s: deadline in %v, want %v", d.Sub(now), time.Hour+ttl)
	}

	// The second turn to us is 5 s old and held us for 1 s: over. The
	// user pinged since (parked by the first turn then): their ping's own
	// TTL stands.
	pinged := "again-pinged"
	now = redisNow(t, s.rdb)
	apply(t, s, ev(pinged, ActivityTurnUs, ttl).hold(time.Hour).at(now.Add(-6*time.Second)))
	if _, err := s.Renew(ctx, pinged, DefaultSegment, ttl, ClockPresence); err != nil {
		t.Fatal(err)
	}
	apply(t, s, ev(pinged, ActivityTurnUs, ttl).hold(time.Second).at(now.Add(-5*time.Second)))
	if d := score(t, s, pinged); !near(d, now.Add(ttl), slack) {
		t.Errorf("a spent turn to us after the user's ping: deadline in %v, want the ping's own %v", d.Sub(now), ttl)
	}

	// A turn to the user 5 s old ends our turn; the user pinged since.
	ended := "again-ended"
	now = redisNow(t, s.rdb)
	apply(t, s, ev(ended, ActivityTurnUs, ttl).hold(time.Hour).at(now.Add(-6*time.Second)))
	if _, err := s.Renew(ctx, ended, DefaultSegment, ttl, ClockPresence); err != nil {
		t.Fatal(err)
	}
	apply(t, s, ev(ended, ActivityTurnUser, ttl).at(now.Add(-5*time.Second)))
	if d := score(t, s, ended); !near(d, now.Add(ttl), slack) {
		t.Errorf("a turn to the user older than the user's ping: deadline in %v, want the ping's own %v", d.Sub(now), ttl)
	}
}
