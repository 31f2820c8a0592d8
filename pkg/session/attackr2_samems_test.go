package session

import (
	"strconv"
	"testing"
	"time"
)

// TestAttackR2SameMsLongerGrantLost: the fix that makes an active of its
// own time stale when at_ms <= the last renewal takes an event of the
// same ms as the renewal for that renewal sent again. But two different
// events of one user may share a ms: the platform's desktop and mobile
// servers each report the user active at the same instant, each of its
// own segment, whose TTLs differ (a user's devices may be of different
// segments; the grant keeps the later of two devices' deadlines). The
// desktop's (1 min) applies first; the mobile's (30 min), of the same
// at_ms, is taken for a resend and dropped as stale: the user is guided
// a minute after, 29 minutes before the grant the platform asked for.
// Applied in the other order both grants count (the 30 min stays): the
// outcome depends on which server's event arrived first.
func TestAttackR2SameMsLongerGrantLost(t *testing.T) {
	s, ctx := newStore(t)
	rules := SegmentRules{Segments: map[string]SegmentRule{
		"desktop": {TTL: time.Minute, Clock: ClockPresence},
		"mobile":  {TTL: 30 * time.Minute, Clock: ClockPresence},
	}, Unlisted: SegmentRule{TTL: time.Minute, Clock: ClockPresence}}
	uid := "attackr2-same-ms"
	at := redisNow(t, s.rdb)
	desktop := Activity{UID: uid, Kind: ActivityActive, Segment: "desktop", At: at}
	mobile := Activity{UID: uid, Kind: ActivityActive, Segment: "mobile", At: at}
	res, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{desktop, mobile})
	if err != nil {
		t.Fatal(err)
	}
	want := at.Add(30 * time.Minute)
	if got := score(t, s, uid); got.Before(want.Add(-time.Second)) {
		t.Fatalf("a desktop active (1 min) and a mobile active (30 min) of the same at_ms %d: %+v; deadline %v after at_ms, want 30m: "+
			"the mobile's grant, of the same ms as the renewal the desktop's wrote, was taken for a resend of it and dropped stale; "+
			"the user is guided %v early", at.UnixMilli(), res, got.Sub(at).Round(time.Second), want.Sub(got).Round(time.Second))
	}
}

// TestAttackR2ActiveOfPingMsDropped: a WebSocket ping records its time,
// Redis's ms, as the user's last renewal. An activity event of the
// platform's servers stamped the same ms (the user typed on the web page
// as its socket pinged; the platform's clock in step with Redis's), with
// a TTL longer than the ping's (the platform's own, for a user in a
// form), is taken for a resend of the ping's renewal and dropped stale:
// the user is guided at the ping's short TTL.
func TestAttackR2ActiveOfPingMsDropped(t *testing.T) {
	s, ctx := newStore(t)
	uid := "attackr2-ping-ms"
	if _, err := s.Renew(ctx, uid, DefaultSegment, time.Minute, ClockPresence); err != nil {
		t.Fatal(err)
	}
	v, err := s.rdb.Get(ctx, s.ks.RenewedKey(uid)).Result()
	if err != nil {
		t.Fatal(err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("renewed %q: %v", v, err)
	}
	at := time.UnixMilli(ms)
	active := Activity{UID: uid, Kind: ActivityActive, At: at, TTL: 30 * time.Minute, Clock: ClockPresence}
	res, err := s.ApplyActivity(ctx, "gw-a", SegmentRules{}, []Activity{active})
	if err != nil {
		t.Fatal(err)
	}
	want := at.Add(30 * time.Minute)
	if got := score(t, s, uid); got.Before(want.Add(-time.Second)) {
		t.Fatalf("an active of 30 min stamped the ms of the user's ping (%d): %+v; deadline %v after it, want 30m: "+
			"taken for a resend of the ping's renewal and dropped, the user is guided at the ping's 1 min",
			ms, res, got.Sub(at).Round(time.Second))
	}
}

// TestAttackR2TurnUserResentAfterTurnUsSameMs: the platform passes the
// turn to the user and, in the same ms, the user answers (a turn to us,
// held up to an hour). The first request's answer is lost and the
// platform sends it again: the turn to the user, at_ms equal to the turn
// to us in force, is not of the same kind, so the fix does not take it
// for a resend. It applies: the turn is the user's again, the hold is
// given up and the deadline falls back to a TTL after it, while the user
// waits for our answer. The same two events at distinct ms leave the
// resend stale (older than the turn in force).
//
// A known limit, not fixed: events of one user with the same at_ms
// order as they arrive, and a turn to us then a turn to the user of the
// same ms must both apply. docs/protocol.md asks for distinct times.
func TestAttackR2TurnUserResentAfterTurnUsSameMs(t *testing.T) {
	t.Skip("known limit: two turns of one user with the same at_ms are ordered as they arrive; a resend of the first after the second is taken for a newer word (docs/protocol.md)")
	s, ctx := newStore(t)
	uid := "attackr2-turn-same-ms"
	at := redisNow(t, s.rdb)
	toUser := ev(uid, ActivityTurnUser, time.Minute).at(at)
	toUs := ev(uid, ActivityTurnUs, time.Minute).at(at).hold(time.Hour)
	apply(t, s, toUser)
	apply(t, s, toUs)
	held := score(t, s, uid)
	res := apply(t, s, toUser) // the first request, sent again
	st, ok, err := s.Turn(ctx, uid)
	if err != nil {
		t.Fatal(err)
	}
	if got := score(t, s, uid); res.Stale != 1 || !ok || !st.Ours || got.Before(held) {
		t.Fatalf("a turn to the user resent after the turn to us of the same at_ms %d: %+v (want stale 1); turn ours %v (want true); "+
			"deadline %v after at_ms, was %v while held: the user, waiting for us, is guided an hour early",
			at.UnixMilli(), res, ok && st.Ours, got.Sub(at).Round(time.Second), held.Sub(at).Round(time.Second))
	}
}

// TestAttackR2WaitAfterEndShortensRememberedEnd: the fix keeps the
// ended turn state as long as its end set when a grant follows it. A
// ping on the turn clock after the end writes the turn clock's wait
// state in its place, which keeps the end's time as its since, for an
// event older than the end to stay stale (its park keeps the keys a day).
// The next ping, on the presence clock, gives the park up: it finds a
// wait, not "ended", and expires the turn state and the renewal to its
// own deadline plus 2h: the end, of a conversation with a 4h segment, is
// forgotten before the platform's last active of it, a minute older than
// the end, is over. Applied again then (a resend, a delayed sender), it
// brings the conversation back and its user is guided. Real time cannot
// pass hours in a test: the keys' PTTL says.
func TestAttackR2WaitAfterEndShortensRememberedEnd(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = 4 * time.Hour
	rules := SegmentRules{Segments: map[string]SegmentRule{"long": {TTL: ttl, Clock: ClockPresence}},
		Unlisted: SegmentRule{TTL: time.Minute, Clock: ClockPresence}}
	uid := "attackr2-wait-after-end"
	now := redisNow(t, s.rdb)
	last := Activity{UID: uid, Kind: ActivityActive, Segment: "long", At: now.Add(-time.Minute)}
	end := Activity{UID: uid, Kind: ActivityEnd, At: now}
	if res, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{last, end}); err != nil || res.Applied != 2 {
		t.Fatalf("%+v, %v", res, err)
	}
	// The user's device, of a turn-clock segment, pings after the end;
	// then a device of a presence-clock segment (or the same one, its
	// segment switched to the presence clock by the operator) pings.
	for _, clock := range []Clock{ClockTurn, ClockPresence} {
		if _, err := s.Renew(ctx, uid, DefaultSegment, time.Minute, clock); err != nil {
			t.Fatal(err)
		}
	}
	turn, _ := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result()
	over := last.At.Add(ttl)
	for _, key := range []string{s.ks.RenewedKey(uid), s.ks.TurnKey(uid)} {
		left, err := s.rdb.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if gone := redisNow(t, s.rdb).Add(left); left <= 0 || gone.Before(over) {
			t.Errorf("after a turn-clock ping then a presence-clock ping that followed the end (turn state %q), %s lives %v: gone %v before an active of a 4h segment, "+
				"a minute older than the end, is over: applied then, the conversation the platform ended comes back, and its user is guided",
				turn, key, left.Round(time.Minute), over.Sub(gone).Round(time.Minute))
		}
	}
}
