package session

import (
	"context"
	"testing"
	"time"
)

// r3EndForgotten applies first, then the platform's end of the
// conversation in a later batch, and reports how long Redis remembers the
// end (the turn and renewed keys' PTTL) against how long a resend of first
// (older than the end) stays applicable: not over until lives from now.
// When the end is forgotten first, it shows what the resend does once it
// is: the keys are removed as their expiry would, and first applied again.
func r3EndForgotten(t *testing.T, rules SegmentRules, first Activity, overAt time.Time) {
	t.Helper()
	s, ctx := newStore(t)
	uid := first.UID
	if _, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{first}); err != nil {
		t.Fatal(err)
	}
	end := Activity{UID: uid, Kind: ActivityEnd}
	res, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{end})
	if err != nil {
		t.Fatal(err)
	}
	if got := score(t, s, uid); !got.IsZero() {
		t.Fatalf("premise: after the end (%+v) the user still has a deadline %v", res, got)
	}
	turnTTL, err := s.rdb.PTTL(ctx, s.ks.TurnKey(uid)).Result()
	if err != nil {
		t.Fatal(err)
	}
	renewedTTL, err := s.rdb.PTTL(ctx, s.ks.RenewedKey(uid)).Result()
	if err != nil {
		t.Fatal(err)
	}
	lives := overAt.Sub(redisNow(t, s.rdb))
	if turnTTL >= lives || renewedTTL >= lives {
		return
	}
	// What a resend of first does once the end is forgotten, as the keys'
	// expiry would have it.
	if err := s.rdb.Del(context.Background(), s.ks.TurnKey(uid), s.ks.RenewedKey(uid)).Err(); err != nil {
		t.Fatal(err)
	}
	again, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{first})
	if err != nil {
		t.Fatal(err)
	}
	t.Fatalf("the platform ended the conversation after a %s event of at_ms %d; the end is remembered for %v (turn key PTTL; renewed %v), "+
		"but a resend of that event, older than the end, is not over for %v: once the end is forgotten, the resend applies (%+v) "+
		"and the ended conversation comes back, its user guided at %v (%v from now)",
		first.Kind, first.At.UnixMilli(), turnTTL.Round(time.Second), renewedTTL.Round(time.Second), lives.Round(time.Second),
		again, score(t, s, uid), time.Until(score(t, s, uid)).Round(time.Minute))
}

// TestAttackR3EndForgottenBeforeHeldTurnUsOver: a turn to us holds the
// user's clock for its max hold, by default MaxTurnHold (24h), from its
// at_ms: a resend of it is over only at at_ms + 24h + TTL. The end
// written after it keeps the "ended" state for activityKeep, which counts
// the rules' and the batch's TTLs but no hold: 2h for a policy of short
// TTLs. From 2h to 24h after the end, a resend of the turn to us (a
// partition's next owner replaying its backlog, a batch resent after a
// consumer was down) finds no end, is applied, and the conversation the
// platform ended comes back: its user is guided a day later.
func TestAttackR3EndForgottenBeforeHeldTurnUsOver(t *testing.T) {
	rules := SegmentRules{Unlisted: SegmentRule{TTL: time.Minute, Clock: ClockPresence}}
	s, _ := newStore(t)
	t0 := redisNow(t, s.rdb)
	turnUs := Activity{UID: "attackr3-held-end", Kind: ActivityTurnUs, At: t0}
	r3EndForgotten(t, rules, turnUs, t0.Add(MaxTurnHold+time.Minute))
}

// TestAttackR3EndForgottenBeforeOwnTTLActiveOver: an active may carry a
// TTL of its own (the platform's, for a user in a long form: 6h here).
// activityKeep counts the events of the batch it applies, not those
// applied before: the end, in a batch of its own, is kept 2h (the rules'
// TTLs are a minute), and a resend of the 6h active, older than the end,
// applies once it is forgotten, bringing the ended conversation back.
func TestAttackR3EndForgottenBeforeOwnTTLActiveOver(t *testing.T) {
	rules := SegmentRules{Unlisted: SegmentRule{TTL: time.Minute, Clock: ClockPresence}}
	s, _ := newStore(t)
	t0 := redisNow(t, s.rdb)
	active := Activity{UID: "attackr3-ownttl-end", Kind: ActivityActive, At: t0, TTL: 6 * time.Hour, Clock: ClockPresence}
	r3EndForgotten(t, rules, active, t0.Add(6*time.Hour))
}

// TestAttackR3TurnKeyAlwaysExpires: guard. Every path that writes the
// turn key (turn events' plain SET before their grant, the wait's and
// the staged KEEPTTL writes, an end's, a close's KEEPTTL) leaves it with
// an expiry: no user's turn state outlives them for ever.
func TestAttackR3TurnKeyAlwaysExpires(t *testing.T) {
	s, ctx := newStore(t)
	uid := "attackr3-expires"
	rules := SegmentRules{Unlisted: SegmentRule{TTL: time.Minute, Clock: ClockTurn}}
	check := func(step string) {
		t.Helper()
		d, err := s.rdb.PTTL(ctx, s.ks.TurnKey(uid)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if d == -1*time.Nanosecond || d == -1*time.Millisecond || (d < 0 && d != -2*time.Nanosecond && d != -2*time.Millisecond) {
			t.Fatalf("after %s the turn key has no expiry (PTTL %v)", step, d)
		}
	}
	step := func(name string, evs ...Activity) {
		t.Helper()
		if _, err := s.ApplyActivity(ctx, "gw-a", rules, evs); err != nil {
			t.Fatal(err)
		}
		check(name)
	}
	if _, err := s.Renew(ctx, uid, DefaultSegment, time.Minute, ClockTurn); err != nil {
		t.Fatal(err)
	}
	check("a first ping on the turn clock (wait)")
	step("a turn to the user", Activity{UID: uid, Kind: ActivityTurnUser})
	step("a turn to us", Activity{UID: uid, Kind: ActivityTurnUs})
	if _, err := s.Renew(ctx, uid, DefaultSegment, time.Minute, ClockPresence); err != nil {
		t.Fatal(err)
	}
	check("a presence ping")
	step("an end", Activity{UID: uid, Kind: ActivityEnd})
	if _, err := s.Renew(ctx, uid, DefaultSegment, time.Minute, ClockTurn); err != nil {
		t.Fatal(err)
	}
	check("a ping after the end (wait)")
	if err := s.End(ctx, uid); err != nil {
		t.Fatal(err)
	}
	check("a last socket close")
	step("an active", Activity{UID: uid, Kind: ActivityActive})
	step("a turn to the user and one to us in one batch", Activity{UID: uid, Kind: ActivityTurnUser}, Activity{UID: uid, Kind: ActivityTurnUs})
}
