package session

import (
	"testing"
	"time"
)

// Attacks on the turn clock's park and what it keeps (the wait state's
// fourth field).

// TestAttackParkKeptOutlivesLastClose: a desktop on "desk" (presence
// clock, a 3 h TTL) and a phone on "chat" (turn clock, 1 min). The
// phone's ping parks the user; the wait keeps the desktop's 3 h grant.
// The user then closes both windows with 1000: the last close deletes
// the session ("no guide follows"), and its grants with it. A minute
// later the user opens the chat on the phone alone; the platform passes
// the turn to the user, who then goes silent. Their silence must count
// from that turn: a TTL. The wait state outlived the close (a close keeps
// the turn state), and with it the closed desktop's grant, which the
// turn to the user takes for a floor: the silent user is guided hours
// late.
func TestAttackParkKeptOutlivesLastClose(t *testing.T) {
	s, ctx := newStore(t)
	const long, short = 3 * time.Hour, time.Minute
	uid := "attack-park-lastclose"
	if _, err := s.Renew(ctx, uid, "desk", long, ClockPresence); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(ctx, uid, "chat", short, ClockTurn); err != nil {
		t.Fatal(err)
	}
	// Both windows closed: the last close ends the session.
	if err := s.End(ctx, uid); err != nil {
		t.Fatal(err)
	}
	if d := score(t, s, uid); !d.IsZero() {
		t.Fatalf("after the last close: index entry in %v, want none", d.Sub(redisNow(t, s.rdb)))
	}
	// Back on the phone alone: parked until a first turn, then the turn.
	if _, err := s.Renew(ctx, uid, "chat", short, ClockTurn); err != nil {
		t.Fatal(err)
	}
	apply(t, s, ev(uid, ActivityTurnUser, short).clock(ClockTurn).segment("chat"))
	now := redisNow(t, s.rdb)
	if d := score(t, s, uid); d.After(now.Add(short + 2*time.Second)) {
		st, _ := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result()
		t.Fatalf("a turn to the user on the phone, the desktop closed with the session before: deadline in %v, want the TTL %v "+
			"(the silent user is guided %v late, by the grant of a device whose session was closed); turn state %q",
			d.Sub(now).Round(time.Second), short, d.Sub(now.Add(short)).Round(time.Second), st)
	}
}

// TestAttackParkSegmentsHashOfOtherTurnDevice: a phone on "chat" and a
// tablet on "chat2", both segments on the turn clock, no turn to the
// user yet: each ping parks the user, and the latest park names its
// segment in the segments hash (the tablet's here, it pinged last). The
// operator then puts both segments on the presence clock (policy set of
// the default clock), and the tablet goes away (a close that is not the
// last). The phone pings on: its segment, which held the user waiting,
// is now on presence, so the user "counts from their next activity in
// that segment". The unpark only happens when the ping's segment is the
// one in the hash: the phone's never is, so the park stands, and the user
// who goes silent on the phone is guided a day late.
func TestAttackParkSegmentsHashOfOtherTurnDevice(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	uid := "attack-park-twoturn"
	if _, err := s.Renew(ctx, uid, "chat", ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	redisPast(t, s.rdb, redisNow(t, s.rdb).Add(5*time.Millisecond))
	if _, err := s.Renew(ctx, uid, "chat2", ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	// Both on presence now; the phone pings on, twice.
	for i := 0; i < 2; i++ {
		if _, err := s.Renew(ctx, uid, "chat", ttl, ClockPresence); err != nil {
			t.Fatal(err)
		}
	}
	now := redisNow(t, s.rdb)
	if d := score(t, s, uid); d.After(now.Add(ttl + 2*time.Second)) {
		seg, _ := s.rdb.HGet(ctx, s.ks.SegmentsKey(Bucket(uid)), uid).Result()
		st, _ := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result()
		t.Fatalf("the phone's pings on its segment, now on the presence clock: deadline in %v, want the TTL %v "+
			"(the silent user is guided %v late); segments hash %q, turn state %q",
			d.Sub(now).Round(time.Second), ttl, d.Sub(now.Add(ttl)).Round(time.Minute), seg, st)
	}
}

// TestAttackParkTurnUsDropsKept: the desktop on "desk" (presence, 10
// min: it pings every 2.5 min) and the phone on "chat" (turn clock, 1
// min), parked; the wait keeps the desktop's grant. The platform's usual
// first events on a turn-clock chat: a turn to us (the user's question
// is queued), then a turn to the user (the agent answered). The turn to
// us replaces the wait, and its kept with it; the turn to the user then
// gives the hold up for the user's last activity plus the phone's TTL:
// a guide due before the desktop, still pinging within its grant, pings
// again ("when the wait ends, the session runs at least as long as their
// grants do"). Without the park (the phone on presence), a turn to the
// user after our turn drops another device's longer grant by design
// (TestActivityOutcomes, "turn to the user keeps a longer grant of
// another device"): this asks whether the wait's kept should survive our
// turn, as it survives a turn to the user directly.
//
// Known limit, not fixed: a turn to us writes a state of three fields
// (whose, since, till), with no room for what a wait kept; a fourth
// would make an earlier release, during a rolling upgrade, read the
// turn to us as no turn state. A turn to the user after our turn gives
// the hold up for the user's last activity plus the turn's TTL, as the
// protocol's established rule says, on the presence clock as on the
// turn clock.
func TestAttackParkTurnUsDropsKept(t *testing.T) {
	t.Skip("known limit: a turn to us carries no kept grants of other devices; a turn to the user after it counts a TTL from the user's last activity (see the comment)")
	s, ctx := newStore(t)
	const long, short = 10 * time.Minute, time.Minute
	uid := "attack-park-turnus"
	if _, err := s.Renew(ctx, uid, "desk", long, ClockPresence); err != nil {
		t.Fatal(err)
	}
	desk := redisNow(t, s.rdb).Add(long)
	if _, err := s.Renew(ctx, uid, "chat", short, ClockTurn); err != nil {
		t.Fatal(err)
	}
	apply(t, s, ev(uid, ActivityTurnUs, short).clock(ClockTurn).segment("chat").hold(time.Hour))
	apply(t, s, ev(uid, ActivityTurnUser, short).clock(ClockTurn).segment("chat"))
	now := redisNow(t, s.rdb)
	if d := score(t, s, uid); d.Before(desk.Add(-2 * time.Second)) {
		t.Fatalf("turn to us, then to the user, on the phone's segment: deadline in %v, before the desktop's grant runs out in %v: "+
			"the user is guided %v early, while the desktop still pings", d.Sub(now).Round(time.Second), desk.Sub(now).Round(time.Second),
			desk.Sub(d).Round(time.Second))
	}
}

// TestAttackParkKeptClearedByEnd: as TestAttackParkKeptOutlivesLastClose,
// but the platform ends the conversation instead of the user closing
// their windows: the end's turn state replaces the wait and what it kept,
// so the next conversation's turn to the user counts a TTL. A guard.
func TestAttackParkKeptClearedByEnd(t *testing.T) {
	s, ctx := newStore(t)
	const long, short = 3 * time.Hour, time.Minute
	uid := "attack-park-end"
	if _, err := s.Renew(ctx, uid, "desk", long, ClockPresence); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(ctx, uid, "chat", short, ClockTurn); err != nil {
		t.Fatal(err)
	}
	if res := apply(t, s, Activity{UID: uid, Kind: ActivityEnd}); res.Applied != 1 {
		t.Fatalf("the end: %+v", res)
	}
	redisPast(t, s.rdb, redisNow(t, s.rdb).Add(5*time.Millisecond))
	if _, err := s.Renew(ctx, uid, "chat", short, ClockTurn); err != nil {
		t.Fatal(err)
	}
	apply(t, s, ev(uid, ActivityTurnUser, short).clock(ClockTurn).segment("chat"))
	now := redisNow(t, s.rdb)
	if d := score(t, s, uid); !near(d, now.Add(short), 2*time.Second) {
		t.Fatalf("a turn to the user in the conversation after an end: deadline in %v, want the TTL %v", d.Sub(now).Round(time.Second), short)
	}
}
