package session

import (
	"testing"
	"time"
)

// Second round of attacks on the turn clock's park (the wait state).

// TestAttackPark2TurnUsMaxHoldOverWait: a chat on a turn-clock segment.
// The user's phone connects and pings: no turn to the user yet, so the
// user is parked waiting for a first turn (MaxTurnHold, a day). The user
// writes; the platform queues the chat for an agent and reports a turn
// to us with max_ms 10 minutes ("no deadline falls due ... until the
// next turn to the user, or max_ms, after which the clock runs as if the
// turn had passed then"). No agent comes and the user goes silent: their
// silence counts from the turn's max hold, and is due a TTL after it.
// The turn to us replaced the wait state, but not the wait's park: the
// deadline the grant keeps (a renewal never moves a deadline earlier) is
// the day-long park, and the silent user is guided a day late.
func TestAttackPark2TurnUsMaxHoldOverWait(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	const hold = 10 * time.Minute
	uid := "attack-park2-turnus-maxhold"
	if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	now := redisNow(t, s.rdb)
	if d := score(t, s, uid); !near(d, now.Add(MaxTurnHold+ttl), 2*time.Second) {
		t.Fatalf("the phone's ping before a first turn: deadline in %v, want parked %v", d.Sub(now), MaxTurnHold+ttl)
	}
	if res := apply(t, s, ev(uid, ActivityTurnUs, ttl).clock(ClockTurn).hold(hold)); res.Applied != 1 {
		t.Fatalf("the turn to us: %+v", res)
	}
	// The phone pings on under our turn, as it would.
	if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	now = redisNow(t, s.rdb)
	if d := score(t, s, uid); d.After(now.Add(hold + ttl + 2*time.Second)) {
		st, _, _ := s.Turn(ctx, uid)
		t.Fatalf("a turn to us with max_ms %v over the turn clock's wait: deadline in %v, want the hold's end plus the TTL %v "+
			"(the user silent from the turn on is guided %v late); turn state %+v",
			hold, d.Sub(now).Round(time.Second), hold+ttl, d.Sub(now.Add(hold+ttl)).Round(time.Minute), st)
	}
}

// TestAttackPark2StagedAfterWaitLapse: a user parked on the turn clock,
// waiting for a first turn, whose devices then stop pinging: the park's
// max hold runs out, the silence counts, and the reminder goes (the
// clock "runs as if the turn had passed then"). The policy's close comes
// 3 h after the reminder. Ten seconds after the reminder the user
// answers it: their phone pings on the turn-clock segment, and the close
// is cancelled, as it must be. "A user between the stages of a silence
// had the turn: their next ping on the turn clock counts from then,
// however long after the deadline it comes": the user, silent again, is
// due a TTL after that ping. The wait state still lives (a turn state is
// kept RenewedKeep past the deadline), and the ping reads it as "no
// first turn yet": parked for another day. Had the ping come after the
// turn key expired (2 h past the deadline), it would count a TTL (the
// stage rule's "user's turn, since 0"): the same user, the same silence,
// a day apart depending on when they answered.
//
// The park's day is simulated by the renewal script's max hold argument
// (the store passes MaxTurnHold): real time cannot pass a day in a test.
func TestAttackPark2StagedAfterWaitLapse(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	const silence = 100 * time.Millisecond // the TTL of the ping that parked
	const maxHold = 200 * time.Millisecond // stands for MaxTurnHold
	const closeAfter = 3 * time.Hour
	uid := "attack-park2-staged-wait"
	if err := renewScript.Run(ctx, s.rdb, s.ks.grantKeys(uid), s.withNotes(
		uid, silence.Milliseconds(), DefaultSegment, "", modeRenew, RenewedKeep.Milliseconds(), 0,
		string(ClockTurn), maxHold.Milliseconds())...).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result(); err != nil {
		t.Fatalf("after the parking ping: turn state %q (%v), want a wait", v, err)
	}
	first := dueOne(t, s, uid, 10*time.Second, sweepAll(s))
	if first.Stage != 1 {
		t.Fatalf("the park's lapse: %+v, want stage 1", first)
	}
	first.NextDue = first.Due.Add(closeAfter)
	if err := s.Settle(ctx, []Expired{first}); err != nil {
		t.Fatal(err)
	}
	// The user answers the reminder on the phone: a ping of the
	// turn-clock segment, between the reminder and the close.
	if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	now := redisNow(t, s.rdb)
	if d := score(t, s, uid); !near(d, now.Add(ttl), 2*time.Second) {
		st, _ := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result()
		t.Fatalf("the user back between the stages of the silence their wait's max hold began: deadline in %v, want the TTL %v "+
			"(their next silence is guided %v late); turn state %q",
			d.Sub(now).Round(time.Second), ttl, d.Sub(now.Add(ttl)).Round(time.Minute), st)
	}
}

// TestAttackPark2RenewerUnparkKeepsOtherDevice: through the batching
// renewer (as the gateway renews): a desktop on "desk" (presence, 10
// min) and a phone on "chat" (turn clock, 1 min) ping in one round
// trip, the phone's parking the user and keeping the desktop's grant.
// The operator switches "chat" to presence; the phone's next ping, in
// the same round trip as a second desktop ping, gives the wait up. The
// user is due no sooner than the desktop's grant (a guard: batching
// changes no script's order or outcome), and no later than it.
func TestAttackPark2RenewerUnparkKeepsOtherDevice(t *testing.T) {
	s, ctx := newStore(t)
	r := runRenewer(t, s)
	const long, short = 10 * time.Minute, time.Minute
	uid := "attack-park2-renewer"
	both := func(deskClock, chatClock Clock) {
		t.Helper()
		errs := make(chan error, 2)
		go func() { _, err := r.Renew(ctx, uid, "desk", long, deskClock); errs <- err }()
		go func() { _, err := r.Renew(ctx, uid, "chat", short, chatClock); errs <- err }()
		for i := 0; i < 2; i++ {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	both(ClockPresence, ClockTurn)
	// Whatever order the two ran in, the phone parks the user once its
	// own turn-clock ping is the latest: send it alone.
	if _, err := r.Renew(ctx, uid, "chat", short, ClockTurn); err != nil {
		t.Fatal(err)
	}
	now := redisNow(t, s.rdb)
	if d := score(t, s, uid); !near(d, now.Add(MaxTurnHold+short), 2*time.Second) {
		t.Fatalf("the phone's turn-clock ping: deadline in %v, want parked %v", d.Sub(now), MaxTurnHold+short)
	}
	desk := redisNow(t, s.rdb)
	both(ClockPresence, ClockPresence)
	now = redisNow(t, s.rdb)
	d := score(t, s, uid)
	if d.Before(desk.Add(long - 2*time.Second)) {
		t.Fatalf("the wait given up: deadline in %v, before the desktop's grant (%v): guided while the desktop pings", d.Sub(now), long)
	}
	if d.After(now.Add(long + 2*time.Second)) {
		st, _ := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result()
		t.Fatalf("the wait given up: deadline in %v, want the desktop's grant %v (guided %v late); turn state %q",
			d.Sub(now).Round(time.Second), long, d.Sub(now.Add(long)).Round(time.Second), st)
	}
}

// TestAttackPark2StaleResyncReparks: a phone on "chat" (turn clock, 5
// min) and a desktop on "desk" (presence, 1 min). The phone's ping parks
// the user, waiting for a first turn. The phone's gateway is then cut
// off from Redis: its next ping is granted but not written (the gateway
// keeps the grant, to resync). The desktop, on another gateway, pings
// after it: the user's latest activity is on the presence clock, and the
// wait is given up ("the turn clock holds a user waiting for a first
// turn only while their latest activity is on it"). The phone's gateway
// is back, and resyncs the phone's grant: a ping older than the
// desktop's. It restores the phone's grant (a resync gives no extra
// time, and takes none), and must not bring the park back: the latest
// activity is still the desktop's. The user, silent on both devices
// from then on, is due when the phone's grant runs out. The resync parks
// them for a day.
func TestAttackPark2StaleResyncReparks(t *testing.T) {
	s, ctx := newStore(t)
	r := runRenewer(t, s)
	const phoneTTL, deskTTL = 5 * time.Minute, time.Minute
	uid := "attack-park2-resync"
	if _, err := r.Renew(ctx, uid, "chat", phoneTTL, ClockTurn); err != nil {
		t.Fatal(err)
	}
	t0 := redisNow(t, s.rdb)
	redisPast(t, s.rdb, t0.Add(50*time.Millisecond))
	// The phone's ping in its gateway's cut: granted, not written.
	t1 := redisNow(t, s.rdb)
	local1 := time.Now()
	redisPast(t, s.rdb, t1.Add(50*time.Millisecond))
	// The desktop's ping, after it, on the presence clock.
	if _, err := s.Renew(ctx, uid, "desk", deskTTL, ClockPresence); err != nil {
		t.Fatal(err)
	}
	t2 := redisNow(t, s.rdb)
	if d := score(t, s, uid); d.After(t2.Add(phoneTTL + 2*time.Second)) {
		t.Fatalf("the desktop's ping on the presence clock: deadline in %v, want the wait given up", d.Sub(t2))
	}
	// The phone's gateway resyncs the grant it could not write.
	taken := time.Now()
	ago := taken.Sub(local1)
	if _, err := r.Resync(ctx, []Grant{{UID: uid, Segment: "chat", Left: phoneTTL - ago, Ago: ago, Clock: ClockTurn, Taken: taken}}); err != nil {
		t.Fatal(err)
	}
	now := redisNow(t, s.rdb)
	want := t1.Add(phoneTTL)
	if d := score(t, s, uid); d.After(want.Add(2 * time.Second)) {
		st, _ := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result()
		t.Fatalf("the resync of the phone's ping, older than the desktop's on the presence clock: deadline in %v, want the phone's grant "+
			"(%v from now): the user silent on both devices is guided %v late; turn state %q",
			d.Sub(now).Round(time.Second), want.Sub(now).Round(time.Second), d.Sub(want).Round(time.Minute), st)
	}
}

// TestAttackPark2TurnUsMaxHoldOverWaitNotDue is
// TestAttackPark2TurnUsMaxHoldOverWait as the listener's sweep sees it,
// with a max hold short enough to pass: the user is not found due once
// the turn to us's max hold and then their TTL have passed.
func TestAttackPark2TurnUsMaxHoldOverWaitNotDue(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = 100 * time.Millisecond
	const hold = 200 * time.Millisecond
	uid := "attack-park2-turnus-notdue"
	if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	if res := apply(t, s, ev(uid, ActivityTurnUs, ttl).clock(ClockTurn).hold(hold)); res.Applied != 1 {
		t.Fatalf("the turn to us: %+v", res)
	}
	runs := redisNow(t, s.rdb).Add(hold + ttl)
	redisPast(t, s.rdb, runs)
	due := waitFor(5*time.Second, func() bool {
		got, _, err := s.Due(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range got {
			if e.UID == uid {
				return true
			}
		}
		return false
	})
	if !due {
		now := redisNow(t, s.rdb)
		t.Fatalf("a turn to us with max_ms %v over the wait, the user silent: not due %v after the hold's end plus the TTL; "+
			"the index says due in %v", hold, now.Sub(runs).Round(time.Second), score(t, s, uid).Sub(now).Round(time.Minute))
	}
}
