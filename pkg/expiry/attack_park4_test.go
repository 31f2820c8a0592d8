package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Fourth round of attacks on the turn clock's park (the wait state), end
// to end: the session scripts and the real listener together, its events
// read back from Kafka. The questions: is a guide ever produced for a
// user parked waiting for a first turn, or while it is our turn; twice for
// one silence; or never for a silence that is real, when a park is given
// up and the user's deadline moves from a day away to a near one.

// park4Rules are the segment rules of the activity events of these
// tests: none is resolved by the rules (each event names its TTL).
var park4Rules = session.SegmentRules{Unlisted: session.SegmentRule{TTL: time.Minute, Clock: session.ClockPresence}}

// apply applies one activity event as the gateway's endpoint would, and
// returns the user's deadline in the index after it.
func (h *harness) apply(e session.Activity) time.Time {
	h.t.Helper()
	if _, err := h.store.ApplyActivity(context.Background(), "gw-park4", park4Rules, []session.Activity{e}); err != nil {
		h.t.Fatal(err)
	}
	return h.deadlineOf(e.UID)
}

// renewClock renews uid on segment as a ping on clock, and returns the
// user's deadline in the index after it (a park's, not the ping's own).
func (h *harness) renewClock(uid, segment string, ttl time.Duration, clock session.Clock) time.Time {
	h.t.Helper()
	if _, err := h.store.Renew(context.Background(), uid, segment, ttl, clock); err != nil {
		h.t.Fatal(err)
	}
	return h.deadlineOf(uid)
}

// deadlineOf is uid's index score; zero when it has none.
func (h *harness) deadlineOf(uid string) time.Time {
	h.t.Helper()
	s, err := h.rdb.ZScore(context.Background(), h.store.Keyspace().IndexKey(session.Bucket(uid)), uid).Result()
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(int64(s))
}

// prefetchOnly is a sweep-mode config whose timeouts are found by the
// read-ahead alone: it reads ahead far (a deadline moved earlier lands
// in a window read already), and the safety sweep comes only once a
// minute, longer than any wait of these tests.
func (h *harness) prefetchOnly() Config {
	cfg := h.config(ModeSweep)
	cfg.PrefetchInterval = 100 * time.Millisecond
	cfg.PrefetchAhead = 30 * time.Second
	cfg.SafetySweepInterval = 10 * time.Minute
	return cfg
}

// onlyEvents checks that the topic holds, for each uid of want, exactly
// the events whose deadlines want lists, in order, and none for the uids
// of none.
func onlyEvents(t *testing.T, evs []timeoutevent.Event, want map[string][]time.Time, none ...string) {
	t.Helper()
	by := byUID(evs)
	for uid, ds := range want {
		got := by[uid]
		if len(got) != len(ds) {
			t.Errorf("%s: %d events %+v, want %d (deadlines %v)", uid, len(got), got, len(ds), ds)
			continue
		}
		for i, d := range ds {
			if got[i].DeadlineMS != d.UnixMilli() {
				t.Errorf("%s: event %d of deadline %d, want %d", uid, i+1, got[i].DeadlineMS, d.UnixMilli())
			}
			if got[i].DetectedMS < got[i].DeadlineMS {
				t.Errorf("%s: event %d detected at %d, before its deadline %d", uid, i+1, got[i].DetectedMS, got[i].DeadlineMS)
			}
		}
	}
	for _, uid := range none {
		if len(by[uid]) != 0 {
			t.Errorf("%s: guided %d times while parked or held on our turn: %+v", uid, len(by[uid]), by[uid])
		}
	}
}

// TestAttackPark4ParkedAndOurTurnNeverGuided: users whose grants run out
// while their clock is held are never guided: one parked on the turn
// clock, waiting for a first turn (a short ping's grant, the park a day
// away); one whose turn to us holds for an hour; one parked whose second
// ping, on the turn clock again after the first's grant ran out, keeps
// the park. Beside them a user whose turn to us holds
// for a short max hold is guided once, a TTL after the hold's end ("the
// clock runs as if the turn had passed then"). Through the listener in
// hybrid mode: sweep, read-ahead and the expired events of the session
// keys.
func TestAttackPark4ParkedAndOurTurnNeverGuided(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stop := h.start(h.config(ModeHybrid))
	defer stop()
	h.waitSubscribed(1)
	const ttl = 300 * time.Millisecond
	parked := h.renewClock("parked", "default", ttl, session.ClockTurn)
	ours := h.apply(session.Activity{UID: "ours", Kind: session.ActivityTurnUs, TTL: ttl, Clock: session.ClockTurn, MaxHold: time.Hour})
	twice := h.renewClock("parked-twice", "default", ttl, session.ClockTurn)
	short := h.apply(session.Activity{UID: "short-hold", Kind: session.ActivityTurnUs, TTL: ttl, Clock: session.ClockPresence, MaxHold: time.Second})
	now := h.redisNow()
	for uid, d := range map[string]time.Time{"parked": parked, "ours": ours, "parked-twice": twice} {
		if d.Before(now.Add(30 * time.Minute)) {
			t.Fatalf("%s: deadline in %v, want held (a park or our turn)", uid, d.Sub(now))
		}
	}
	// parked-twice's first grant ran out; its next ping keeps the park.
	h.untilRedis(now.Add(2 * ttl))
	twice = h.renewClock("parked-twice", "default", ttl, session.ClockTurn)
	if twice.Before(now.Add(30 * time.Minute)) {
		t.Fatalf("parked-twice: the second ping moved the park to %v", twice.Sub(now))
	}
	h.waitProduced(1)
	h.sweptPast(short.Add(testGrace + time.Second))
	onlyEvents(t, h.events(), map[string][]time.Time{"short-hold": {short}}, "parked", "ours", "parked-twice")
}

// TestAttackPark4DeadlineMovedEarlierInsideReadWindow: the read-ahead
// reads each bucket's next PrefetchAhead once, and arms timers for what
// it found. A park given up moves the user's deadline from a day away to
// a TTL from now: inside a window read already. So does a turn to the
// user after a turn to us, and a turn to the user after a short turn to
// us whose timer is armed already (the deadline moves before its timer).
// Each is found by the next read's overdue part ("found ... within
// PrefetchInterval"), not left to the safety sweep (ten minutes here):
// each user is guided once, near their new deadline, and never at the
// old one.
func TestAttackPark4DeadlineMovedEarlierInsideReadWindow(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.prefetchOnly()
	stop := h.start(cfg)
	defer stop()
	h.sweptPast(h.redisNow())

	const ttl = 2 * time.Second
	// Parked a day, then given up by a ping on the presence clock.
	h.renewClock("unparked", "default", 200*time.Millisecond, session.ClockTurn)
	// Our turn for an hour, then the user's.
	h.apply(session.Activity{UID: "us-then-user", Kind: session.ActivityTurnUs, TTL: time.Minute, Clock: session.ClockTurn, MaxHold: time.Hour})
	// Our turn for 10 s (its deadline, 10 s + a minute away, read ahead
	// once the window gets there: not yet), then the user's.
	h.apply(session.Activity{UID: "armed", Kind: session.ActivityTurnUs, TTL: 15 * time.Second, Clock: session.ClockTurn, MaxHold: 10 * time.Second})
	armedOld := h.deadlineOf("armed")
	// Let the windows read past the old deadline of "armed": its timer
	// is armed.
	h.sweptPast(h.redisNow())

	want := map[string][]time.Time{
		"unparked":     {h.renewClock("unparked", "default", ttl, session.ClockPresence)},
		"us-then-user": {h.apply(session.Activity{UID: "us-then-user", Kind: session.ActivityTurnUser, TTL: ttl, Clock: session.ClockTurn})},
		"armed":        {h.apply(session.Activity{UID: "armed", Kind: session.ActivityTurnUser, TTL: ttl, Clock: session.ClockTurn})},
	}
	now := h.redisNow()
	for uid, ds := range want {
		if d := ds[0]; d.After(now.Add(ttl)) || d.Before(now.Add(ttl-time.Second)) {
			t.Fatalf("%s: deadline in %v after the park or our turn was given up, want the TTL %v", uid, d.Sub(now), ttl)
		}
	}
	h.waitProduced(3)
	// Nothing at armed's old deadline either.
	h.sweptPast(armedOld.Add(time.Second))
	evs := h.events()
	onlyEvents(t, evs, want)
	for _, ev := range evs {
		late := time.Duration(ev.DetectedMS-ev.DeadlineMS) * time.Millisecond
		t.Logf("%s: detected %v after its deadline", ev.UID, late)
		if late > 5*time.Second {
			// The read-ahead missed it; something else (a restart's
			// read from scratch) found it.
			t.Errorf("%s: detected %v after its new deadline (read-ahead every %v)", ev.UID, late, cfg.PrefetchInterval)
		}
	}
}

// TestAttackPark4ParkClearsHeldTimeout: a user's desktop grant (presence
// clock) runs out in a blind interval: the listener holds its timeout
// until the grace after the interval. Meanwhile the user's phone pings
// on a turn-clock segment: the user is back, and parked, waiting for a
// first turn. The held timeout must not be produced at its release (the
// user came back), nor the park's grant; then a ping of the desktop gives
// the park up, and the user, silent after it, is guided once, at the
// desktop's new deadline (or the phone's grant the wait kept, whichever
// is later).
func TestAttackPark4ParkClearsHeldTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stop := h.start(h.config(ModeHybrid))
	defer stop()
	h.waitSubscribed(1)
	start := h.redisNow()
	blindEnd := start.Add(time.Second)
	if err := h.store.RecordBlind(context.Background(), session.BlindInterval{Start: start, End: blindEnd, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	first := h.renewClock("held-parked", "desk", 300*time.Millisecond, session.ClockPresence)
	waitFor(t, waitLong, "the desktop's timeout to be held", func() bool { return h.inHold("held-parked") })
	phone := 2 * time.Second
	park := h.renewClock("held-parked", "chat", phone, session.ClockTurn)
	if now := h.redisNow(); park.Before(now.Add(time.Hour)) {
		t.Fatalf("the phone's ping on the turn clock: deadline in %v, want parked", park.Sub(now))
	}
	if h.inHold("held-parked") {
		t.Fatal("the held timeout outlived the phone's ping")
	}
	// Past the hold's release, and the phone's own grant.
	h.sweptPast(blindEnd.Add(testGrace + time.Second))
	if evs := byUID(h.events())["held-parked"]; len(evs) != 0 {
		t.Fatalf("guided while parked (first silence at %d): %+v", first.UnixMilli(), evs)
	}
	desk := h.renewClock("held-parked", "desk", 500*time.Millisecond, session.ClockPresence)
	if now := h.redisNow(); desk.After(now.Add(phone)) {
		t.Fatalf("the desktop's ping after the park: deadline in %v, want its own TTL or less", desk.Sub(now))
	}
	h.waitProduced(1)
	h.sweptPast(desk.Add(testGrace + time.Second))
	onlyEvents(t, h.events(), map[string][]time.Time{"held-parked": {desk}})
}

// TestAttackPark4BetweenStagesTurnPingThenPark: a two-stage policy, a
// reminder and a close 6 s after it. A user on the turn clock, whose
// turn it is, goes silent: reminded. Between the reminder and the close
// their phone pings on the turn clock ("a user between the stages of a
// silence had the turn: their next ping on the turn clock counts from
// then"): no close; their next silence is reminded once, a TTL after the
// ping, and closed once after it. Its deadline falls in the minute of the
// first reminder's, whose guide went out (nothing here marks it stale, as
// a gateway's ping that supersedes it would): documented, the second is
// guided at the minute's end (README, "The promise, exactly"). An `end`
// and a ping after it then park them: nothing more, though their grant
// runs out.
func TestAttackPark4BetweenStagesTurnPingThenPark(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	closeAfter := 6 * time.Second
	p := policy.Policy{
		DefaultTTL: 10 * time.Second,
		SegmentStages: map[string][]policy.Stage{
			"chat": {{Action: timeoutevent.ActionRemind}, {After: closeAfter, Action: timeoutevent.ActionClose, Text: "Closed."}},
		},
	}
	h.savePolicy(p)
	cfg := h.config(ModeHybrid)
	cfg.PolicyRefresh = 100 * time.Millisecond
	l, stop := h.startListener(cfg)
	defer stop()
	waitFor(t, waitLong, "the listener to apply the policy", func() bool { return l.policy.Current().Equal(p) })
	h.waitSubscribed(1)

	const uid = "staged"
	const ttl = 500 * time.Millisecond
	first := h.apply(session.Activity{UID: uid, Segment: "chat", Kind: session.ActivityTurnUser, TTL: ttl, Clock: session.ClockTurn})
	waitFor(t, waitLong, "the reminder", func() bool { s, _, ok := h.nextStage(uid); return ok && s == 2 })
	if _, due, _ := h.nextStage(uid); !h.redisNow().Before(due.Add(-time.Second)) {
		t.Skip("the machine came too late to act between the stages")
	}
	second := h.renewClock(uid, "chat", ttl, session.ClockTurn)
	if now := h.redisNow(); second.After(now.Add(ttl)) {
		t.Fatalf("the ping between the stages: deadline in %v, want the TTL %v", second.Sub(now), ttl)
	}
	within := time.Until(session.DedupWindowEnd(second)) + closeAfter + 2*waitLong
	if !eventually(within, func() bool { return len(byUID(h.events())[uid]) >= 3 }) {
		st, due, ok := h.nextStage(uid)
		turn, _ := h.rdb.Get(context.Background(), h.store.Keyspace().TurnKey(uid)).Result()
		t.Fatalf("no close of the second silence (deadline %d) after %v: events %+v; next stage %d at %v (%v); index %v; turn state %q",
			second.UnixMilli(), within, byUID(h.events())[uid], st, due, ok, h.deadlineOf(uid), turn)
	}
	// The conversation ends; a ping after it parks the user.
	h.apply(session.Activity{UID: uid, Kind: session.ActivityEnd})
	park := h.renewClock(uid, "chat", ttl, session.ClockTurn)
	if now := h.redisNow(); park.Before(now.Add(time.Hour)) {
		t.Fatalf("the ping after the end: deadline in %v, want parked", park.Sub(now))
	}
	h.sweptPast(h.redisNow().Add(ttl + testGrace))
	evs := byUID(h.events())[uid]
	if len(evs) != 3 {
		t.Fatalf("%d events %+v, want the first silence's reminder, then the second's reminder and close", len(evs), evs)
	}
	wantEv := []struct {
		stage    int
		deadline time.Time
	}{{1, first}, {1, second}, {2, second}}
	for i, w := range wantEv {
		if evs[i].Stage != w.stage || evs[i].DeadlineMS != w.deadline.UnixMilli() {
			t.Errorf("event %d: stage %d of deadline %d, want stage %d of %d", i+1, evs[i].Stage, evs[i].DeadlineMS, w.stage, w.deadline.UnixMilli())
		}
	}
	// The second reminder no later than its minute's end (the minute
	// rule), give or take a busy machine.
	if late := time.UnixMilli(evs[1].DetectedMS).Sub(later(session.DedupWindowEnd(second), second)); late > releaseSlack {
		t.Errorf("the second silence's reminder detected %v after its deadline's minute ended", late)
	}
}

// TestAttackPark4UnparkInGuidedMinute: a user is guided at a deadline; back
// at once, they are parked on the turn clock, then give the park up with
// a ping on the presence clock whose deadline falls in the same minute
// window as the guided one. The second silence is real: documented, it is
// held to the window's end (the minute rule) and produced then, once: not
// taken for the first ("produced:<ms>" names the deadline).
func TestAttackPark4UnparkInGuidedMinute(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stop := h.start(h.config(ModeHybrid))
	defer stop()
	h.waitSubscribed(1)
	windowEnd := h.waitSecondOfMinute(0, 30)
	const uid = "minute"
	first := h.renewClock(uid, "default", 300*time.Millisecond, session.ClockPresence)
	h.waitProduced(1)
	park := h.renewClock(uid, "chat", 200*time.Millisecond, session.ClockTurn)
	if now := h.redisNow(); park.Before(now.Add(time.Hour)) {
		t.Fatalf("ping on the turn clock: deadline in %v, want parked", park.Sub(now))
	}
	second := h.renewClock(uid, "default", 500*time.Millisecond, session.ClockPresence)
	if session.DedupWindow(second) != session.DedupWindow(first) {
		t.Skip("the machine took the second deadline past the first's minute window")
	}
	t.Logf("second deadline %v after the first, the window ends %v after it", second.Sub(first), windowEnd.Sub(first))
	h.untilRedis(windowEnd)
	h.waitProduced(2)
	h.sweptPast(h.redisNow().Add(testGrace))
	onlyEvents(t, h.events(), map[string][]time.Time{uid: {first, second}})
}
