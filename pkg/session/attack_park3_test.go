package session

import (
	"testing"
	"time"
)

// Third round of attacks on the turn clock's park (the wait state).

// parkLapse parks uid on the turn clock with a ping of TTL silence and a
// max hold of maxHold (standing for MaxTurnHold: real time cannot pass a
// day in a test), lets the park lapse, and settles its stage 1 with the
// close due closeAfter later: the user is between the stages of the
// silence the wait's max hold began.
func parkLapse(t *testing.T, s *Store, uid string, silence, maxHold, closeAfter time.Duration) {
	t.Helper()
	ctx := t.Context()
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
}

// TestAttackPark3SecondPingAfterWaitLapse: as
// TestAttackPark2StagedAfterWaitLapse, a user whose wait for a first
// turn lapsed at its max hold gets the reminder, and answers it: their
// phone pings on the turn-clock segment between the reminder and the
// close, and is due a TTL later ("a user between the stages of a silence
// had the turn"). The phone pings on, as a client does, every quarter of
// the TTL: the user is present, then goes silent. Each ping must count a
// TTL: it is the user's turn. The first ping wrote the user's turn, and
// then wrote the wait back over it, still standing (its kept grants): the
// second ping parks the user for another day, and the user who goes
// silent after it is guided a day late.
func TestAttackPark3SecondPingAfterWaitLapse(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	uid := "attack-park3-second-ping"
	parkLapse(t, s, uid, 100*time.Millisecond, 200*time.Millisecond, 3*time.Hour)
	for i := 1; i <= 2; i++ {
		if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockTurn); err != nil {
			t.Fatal(err)
		}
		now := redisNow(t, s.rdb)
		st, _ := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result()
		t.Logf("after ping %d: turn state %q", i, st)
		if d := score(t, s, uid); !near(d, now.Add(ttl), 2*time.Second) {
			t.Fatalf("ping %d of the user back between the stages of the silence their wait's max hold began: deadline in %v, "+
				"want the TTL %v (the user silent after it is guided %v late); turn state %q",
				i, d.Sub(now).Round(time.Second), ttl, d.Sub(now.Add(ttl)).Round(time.Minute), st)
		}
	}
}

// TestAttackPark3LapsedPresenceKeepsPark: a phone on "chat" (turn clock,
// 1 min) parks the user, waiting for a first turn. The desktop, on
// "desk" (presence clock, a short TTL), then pings on a gateway cut off
// from Redis: granted, not written. The user is silent on both devices
// from then on; the desktop's grant runs out in the outage, and its
// gateway, back, resyncs it lapsed. The user's latest activity is on the
// presence clock: the wait is given up ("only while their latest
// activity is on it"), and the user is due once the phone's grant, which
// the wait kept, runs out. A resync of the same grant with time left
// does give the wait up; the lapsed one leaves the park, and the silent
// user is guided a day late.
func TestAttackPark3LapsedPresenceKeepsPark(t *testing.T) {
	s, ctx := newStore(t)
	r := runRenewer(t, s)
	const phoneTTL, deskTTL = time.Minute, 100 * time.Millisecond
	uid := "attack-park3-lapsed-presence"
	if _, err := r.Renew(ctx, uid, "chat", phoneTTL, ClockTurn); err != nil {
		t.Fatal(err)
	}
	t0 := redisNow(t, s.rdb)
	if d := score(t, s, uid); !near(d, t0.Add(MaxTurnHold+phoneTTL), 2*time.Second) {
		t.Fatalf("the phone's ping before a first turn: deadline in %v, want parked %v", d.Sub(t0), MaxTurnHold+phoneTTL)
	}
	redisPast(t, s.rdb, t0.Add(50*time.Millisecond))
	// The desktop's ping in its gateway's cut: granted, not written.
	t1 := redisNow(t, s.rdb)
	local1 := time.Now()
	redisPast(t, s.rdb, t1.Add(deskTTL+100*time.Millisecond))
	taken := time.Now()
	ago := taken.Sub(local1)
	if _, err := r.Resync(ctx, []Grant{{UID: uid, Segment: "desk", Left: deskTTL - ago, Ago: ago, Clock: ClockPresence, Taken: taken}}); err != nil {
		t.Fatal(err)
	}
	now := redisNow(t, s.rdb)
	want := t0.Add(phoneTTL)
	if d := score(t, s, uid); d.After(want.Add(2 * time.Second)) {
		st, _ := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result()
		t.Fatalf("the lapsed resync of the desktop's ping on the presence clock, the user's latest activity: deadline in %v, "+
			"want the phone's grant the wait kept (%v from now): the user silent on both devices is guided %v late; turn state %q",
			d.Sub(now).Round(time.Second), want.Sub(now).Round(time.Second), d.Sub(want).Round(time.Minute), st)
	}
}

// TestAttackPark3GivenUpWaitExpires: the turn state lives only as long
// as it is needed. A phone on "chat" (turn clock) parks the user; the
// desktop's ping on "desk" (presence) gives the wait up, which rewrites
// the state (the wait kept for its since); a last close then rewrites it
// again, keeping its TTL. A state without a TTL would outlive the user
// for good, and a wait with it. A guard: each rewrite has a TTL.
func TestAttackPark3GivenUpWaitExpires(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	uid := "attack-park3-ttl"
	pttl := func(step string) {
		t.Helper()
		d, err := s.rdb.PTTL(ctx, s.ks.TurnKey(uid)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if d <= 0 || d > MaxTurnHold+ttl+RenewedKeep+time.Minute {
			st, _ := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result()
			t.Fatalf("%s: turn state %q lives %v", step, st, d)
		}
	}
	if _, err := s.Renew(ctx, uid, "chat", ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	pttl("parked")
	if _, err := s.Renew(ctx, uid, "desk", ttl, ClockPresence); err != nil {
		t.Fatal(err)
	}
	pttl("the wait given up")
	if _, err := s.Renew(ctx, uid, "chat", ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	pttl("parked again")
	if err := s.End(ctx, uid); err != nil {
		t.Fatal(err)
	}
	pttl("the last close")
	apply(t, s, ev(uid, ActivityActive, ttl).clock(ClockTurn).segment("chat"))
	pttl("an active on the turn clock after the close")
	apply(t, s, ev(uid, ActivityActive, ttl).clock(ClockPresence).segment("desk"))
	pttl("an active on the presence clock")
}
