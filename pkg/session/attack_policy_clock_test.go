package session

import (
	"testing"
	"time"
)

// TestAttackPolicyParkOutlivesSwitchToPresence: a segment on the turn
// clock parks a user's session until the first turn to the user
// (MaxTurnHold). The operator then switches the segment to the presence
// clock (gateway policy set -clock seg=presence, picked up live), and the
// platform sends no turn for it any more: on the presence clock a silence
// counts from the user's last activity. The user pings (or the platform
// reports them active) under the presence clock, then goes silent. Their
// silence must be due a TTL after that last activity. The park of the old
// clock must not be taken for a later grant the ping may not pull in.
func TestAttackPolicyParkOutlivesSwitchToPresence(t *testing.T) {
	const ttl = time.Minute
	for _, how := range []string{"ping", "active"} {
		t.Run(how, func(t *testing.T) {
			s, ctx := newStore(t)
			uid := "attack-policy-park-" + how
			// Under the turn clock: parked until a first turn to the user.
			if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockTurn); err != nil {
				t.Fatal(err)
			}
			now := redisNow(t, s.rdb)
			if d := score(t, s, uid); !near(d, now.Add(MaxTurnHold+ttl), 2*time.Second) {
				t.Fatalf("turn clock before a first turn: deadline in %v, want parked %v", d.Sub(now), MaxTurnHold+ttl)
			}
			// The segment is on the presence clock now: the user's activity
			// under it.
			switch how {
			case "ping":
				if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockPresence); err != nil {
					t.Fatal(err)
				}
			case "active":
				apply(t, s, ev(uid, ActivityActive, ttl).clock(ClockPresence))
			}
			now = redisNow(t, s.rdb)
			if d := score(t, s, uid); !near(d, now.Add(ttl), 2*time.Second) {
				t.Fatalf("a %s on the presence clock after the segment left the turn clock: deadline in %v, want the TTL %v "+
					"(the user's silence from now on would be guided %v late)", how, d.Sub(now), ttl, d.Sub(now.Add(ttl)).Round(time.Second))
			}
		})
	}
}

// TestAttackPolicyTurnForgottenBetweenLongStages: a segment on the turn
// clock whose policy has a long gap between stages (valid: a stage may
// follow the one before by up to 24 h), say a reminder at the deadline
// and a close 3 h later. The platform passed the turn to the user; the
// user went silent, got the reminder, and comes back 2.5 h later, before
// the close: it is still their turn (no turn event since). Their ping
// cancels the close, as it should, and their next silence must count
// from it: a TTL. But the turn state lives only RenewedKeep (2 h) past
// the deadline, not as long as the silence's stages: it is gone, and the
// ping on the turn clock reads "no turn yet", parking the user for a
// day. Redis's expiry of the turn key is simulated here (after checking
// its TTL says it is gone by then): real time cannot pass 2 h in a test.
func TestAttackPolicyTurnForgottenBetweenLongStages(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	const closeAfter = 3 * time.Hour
	const back = 150 * time.Minute         // after the deadline, before the close
	const silence = 100 * time.Millisecond // the TTL the user went silent on
	uid := "attack-policy-longstage"
	apply(t, s, ev(uid, ActivityTurnUser, silence).clock(ClockTurn))
	// The reminder goes, and the close is due closeAfter later: the user
	// is between the stages of their silence.
	first := dueOne(t, s, uid, 5*time.Second, sweepAll(s))
	deadline := first.Deadline
	first.NextDue = first.Due.Add(closeAfter)
	if err := s.Settle(ctx, []Expired{first}); err != nil {
		t.Fatal(err)
	}
	now := redisNow(t, s.rdb)
	left, err := s.rdb.PTTL(ctx, s.ks.TurnKey(uid)).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The user is silent from now on: nothing refreshes the turn key
	// until they come back, back after the deadline.
	if gone := now.Add(left); !gone.Before(deadline.Add(back)) {
		t.Fatalf("turn key lives %v, past the user's return %v after the deadline: the case does not arise", left, back)
	}
	t.Logf("turn key lives %v: gone %v after the deadline, while the close is due %v after it",
		left, now.Add(left).Sub(deadline), closeAfter)
	if err := s.rdb.Del(ctx, s.ks.TurnKey(uid)).Err(); err != nil { // its PTTL ran out
		t.Fatal(err)
	}
	// The user comes back: a ping of the turn-clock segment.
	if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	now = redisNow(t, s.rdb)
	if d := score(t, s, uid); !near(d, now.Add(ttl), 2*time.Second) {
		t.Fatalf("the user back on their turn, between a reminder and a close 3h later: deadline in %v, want the TTL %v "+
			"(their next silence is guided %v late)", d.Sub(now), ttl, d.Sub(now.Add(ttl)).Round(time.Minute))
	}
}
