package session

import (
	"testing"
	"time"
)

// TestAttackTurnFixUnparkForgetsEnd: a conversation on a turn-clock
// segment: the turn passed to the user, then to us (an agent took the
// chat, max_ms an hour), then the platform ended it. The user's tab is
// still open and pings: on the turn clock that parks them waiting for a
// first turn, and the wait keeps the end's time as its since, so that an
// event older than the end stays stale. The operator switches the
// segment to the presence clock; the user's next ping gives the wait up
// (the grant's new rule). The platform then sends its last batch again
// (it got a 503, or its Kafka consumer stopped between applying and
// committing): "applying an event twice is harmless", "an event applies
// only when it is newer than the state it would change". Every event of
// it is older than the end, and must change nothing: the user, silent
// from their last ping, is due a TTL after it. Were the turn to us
// applied again, the user would be held an hour past their silence.
func TestAttackTurnFixUnparkForgetsEnd(t *testing.T) {
	for _, flip := range []bool{false, true} {
		name := "presence-all-along"
		if flip {
			name = "turn-then-presence"
		}
		t.Run(name, func(t *testing.T) {
			s, ctx := newStore(t)
			const ttl = time.Minute
			const hold = time.Hour
			uid := "attack-turnfix-end-" + name
			clock := ClockPresence
			if flip {
				clock = ClockTurn
			}
			now := redisNow(t, s.rdb)
			t1, t2, e := now.Add(-3*time.Second), now.Add(-2*time.Second), now.Add(-time.Second)
			batch := []Activity{
				ev(uid, ActivityTurnUser, ttl).clock(clock).at(t1),
				ev(uid, ActivityTurnUs, ttl).clock(clock).hold(hold).at(t2),
				{UID: uid, Kind: ActivityEnd, At: e},
			}
			if res := apply(t, s, batch...); res.Applied != 3 {
				t.Fatalf("the batch, first time: %+v", res)
			}
			// The user's tab pings after the end: on the turn clock a
			// wait for a first turn, since the end.
			if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, clock); err != nil {
				t.Fatal(err)
			}
			// The segment is on the presence clock now (or was all
			// along): the user's last ping.
			if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockPresence); err != nil {
				t.Fatal(err)
			}
			pinged := redisNow(t, s.rdb)
			if d := score(t, s, uid); !near(d, pinged.Add(ttl), 2*time.Second) {
				t.Errorf("after the presence ping: deadline in %v, want the TTL %v", d.Sub(pinged), ttl)
			}
			// The same batch again, every event older than the end.
			for i := range batch {
				if batch[i].Kind != ActivityEnd {
					batch[i].Clock = ClockPresence
				}
			}
			before := score(t, s, uid)
			res := apply(t, s, batch...)
			again := redisNow(t, s.rdb)
			d := score(t, s, uid)
			if res.Applied != 0 || d.After(before) {
				st, ok, _ := s.Turn(ctx, uid)
				t.Fatalf("the batch sent again, all of it older than the end: %+v (want all stale); turn state %+v (%v); "+
					"deadline in %v, want the last ping's %v (the TTL %v): the silent user is guided %v late",
					res, st, ok, d.Sub(again), before.Sub(again).Round(time.Second), ttl, d.Sub(before).Round(time.Second))
			}
		})
	}
}

// TestAttackTurnFixUnparkDropsOtherDevice: a user with two devices on
// two segments: a desktop on "desk" (presence clock, a 10 min TTL) and a
// phone on "chat" (turn clock, a 1 min TTL). The desktop pings, its pong
// says 10 min: it next pings at a quarter of that, 2.5 min later. The
// phone's ping parks the session (no turn to the user yet on "chat").
// Then the "chat" segment is switched to the presence clock, and the
// phone's next ping gives the park up ("ping"); or the platform passes
// the turn to the user on "chat" ("turn"). The desktop is still there:
// its last grant runs 10 min, and it pings again within it. The user is
// present while any of their devices pings: no guide may be due before
// the desktop's grant has run out.
func TestAttackTurnFixUnparkDropsOtherDevice(t *testing.T) {
	for _, how := range []string{"ping", "turn"} {
		t.Run(how, func(t *testing.T) {
			s, ctx := newStore(t)
			const long, short = 10 * time.Minute, time.Minute
			uid := "attack-turnfix-devices-" + how
			if _, err := s.Renew(ctx, uid, "desk", long, ClockPresence); err != nil {
				t.Fatal(err)
			}
			desk := redisNow(t, s.rdb).Add(long)
			if _, err := s.Renew(ctx, uid, "chat", short, ClockTurn); err != nil {
				t.Fatal(err)
			}
			switch how {
			case "ping":
				if _, err := s.Renew(ctx, uid, "chat", short, ClockPresence); err != nil {
					t.Fatal(err)
				}
			case "turn":
				apply(t, s, ev(uid, ActivityTurnUser, short).clock(ClockTurn).segment("chat"))
			}
			now := redisNow(t, s.rdb)
			if d := score(t, s, uid); d.Before(desk.Add(-2 * time.Second)) {
				t.Fatalf("after the phone's %s: deadline in %v, before the desktop's grant runs out in %v: "+
					"the user is guided %v early, while the desktop still pings", how, d.Sub(now), desk.Sub(now),
					desk.Sub(d).Round(time.Second))
			}
		})
	}
}

// TestAttackTurnFixResyncKeepsPark: a segment on the turn clock parks a
// user waiting for a first turn. The operator switches it to the
// presence clock. The user's last ping comes while the gateway cannot
// reach Redis; the gateway resyncs it once Redis is back, with the
// segment's clock, now presence; the user is silent from that ping on.
// On the presence clock their silence counts from that ping ("counts
// from that activity once the segment is on presence"): it is due a TTL
// after it. The resync keeps the park of the old clock instead: the
// silent user is guided a day late.
func TestAttackTurnFixResyncKeepsPark(t *testing.T) {
	s, ctx := newStore(t)
	r := runRenewer(t, s)
	const ttl = time.Minute
	uid := "attack-turnfix-resync"
	if _, err := r.Renew(ctx, uid, DefaultSegment, ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	// The ping in the outage, a second ago, granted the TTL then: after
	// the park (a resync of a ping older than a renewal Redis knows of
	// restores nothing).
	const ago = time.Second
	redisPast(t, s.rdb, redisNow(t, s.rdb).Add(ago+500*time.Millisecond))
	if _, err := r.Resync(ctx, []Grant{{UID: uid, Segment: DefaultSegment, Left: ttl - ago, Ago: ago, Clock: ClockPresence}}); err != nil {
		t.Fatal(err)
	}
	now := redisNow(t, s.rdb)
	pinged := now.Add(-ago)
	if d := score(t, s, uid); d.After(pinged.Add(ttl + 2*time.Second)) {
		t.Fatalf("the user's last ping, on the presence clock, resynced after an outage: deadline in %v, want %v "+
			"(a TTL after that ping): the silent user is guided %v late",
			d.Sub(now), pinged.Add(ttl).Sub(now), d.Sub(pinged.Add(ttl)).Round(time.Second))
	}
}
