package session

import (
	"testing"
	"time"
)

// TestAttack23StaleTurnAfterEnd: the platform ends a conversation, then a
// turn event it sent earlier (older at_ms: a retry, another producer, a
// record of an earlier batch) arrives. The promise: an event older than
// the user's state it would change changes nothing. The end is that
// state: it is newer. Yet the end deletes the turn key, and a turn event
// is judged stale only against the turn key's time, so the old turn
// brings the ended session back: a turn to the user starts a silence
// that is guided a TTL later, a turn to us parks one that is guided
// after the max hold, both to a user whose conversation is over.
func TestAttack23StaleTurnAfterEnd(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	for _, kind := range []ActivityKind{ActivityTurnUser, ActivityTurnUs} {
		t.Run(string(kind), func(t *testing.T) {
			uid := "attack23-" + string(kind)
			now := redisNow(t, s.rdb)
			apply(t, s, ev(uid, ActivityActive, ttl).at(now.Add(-time.Minute)))
			if res := apply(t, s, Activity{UID: uid, Kind: ActivityEnd, At: now}); res.Applied != 1 {
				t.Fatalf("end: %+v, want applied", res)
			}
			// A turn from before the end.
			res := apply(t, s, ev(uid, kind, ttl).at(now.Add(-10*time.Second)))
			live, err := s.Live(ctx, uid)
			if err != nil {
				t.Fatal(err)
			}
			if d := score(t, s, uid); res.Stale != 1 || live || !d.IsZero() {
				t.Fatalf("a %s older than the end: %+v, live %v, deadline in %v; want it stale, the session still ended",
					kind, res, live, d.Sub(now))
			}
		})
	}
}

// TestAttack23ParkOutlivesClockChange: a segment on the turn clock parks
// a session until the first turn to the user (MaxTurnHold). The operator
// then sets the segment to the presence clock (policy set, picked up
// live). The platform passes the turn to the user: on the presence clock
// the user's silence now counts from this renewal, a TTL. But the turn
// event ends a park only when the clock it carries is the turn clock (or
// the stored turn is ours), so the park of the old clock is taken for
// "another device's longer grant" and kept: the silent user is guided a
// day late. The promise broken: one guide per silence, on time.
func TestAttack23ParkOutlivesClockChange(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	uid := "attack23-clockchange"
	if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockTurn); err != nil {
		t.Fatal(err)
	}
	now := redisNow(t, s.rdb)
	if d := score(t, s, uid); !near(d, now.Add(MaxTurnHold+ttl), 2*time.Second) {
		t.Fatalf("turn clock before a first turn: deadline in %v, want parked %v", d.Sub(now), MaxTurnHold+ttl)
	}
	// The segment is on the presence clock now.
	apply(t, s, ev(uid, ActivityTurnUser, ttl).clock(ClockPresence))
	now = redisNow(t, s.rdb)
	if d := score(t, s, uid); !near(d, now.Add(ttl), 2*time.Second) {
		t.Fatalf("turn to the user after the clock changed to presence: deadline in %v, want %v", d.Sub(now), ttl)
	}
}

// TestAttack23FutureAtReordered: the platform's clock runs a few seconds
// ahead of Redis's (the endpoint accepts an at_ms up to a day ahead). It
// passes the turn to the user, then to us (an agent picks the chat up);
// the two reach us in the other order (two producers, a retry). By at_ms
// the turn to the user is older than the stored turn to us, and must
// change nothing. But the script clamps each at_ms to Redis's now before
// it compares, and stores the clamped time: the turn to us is stored as
// of now, the turn to the user, clamped to a later now, looks newer and
// applies. The promise broken: a user waiting for us gets their clock
// run, and a guide a TTL later.
func TestAttack23FutureAtReordered(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	uid := "attack23-ahead"
	now := redisNow(t, s.rdb)
	apply(t, s, ev(uid, ActivityTurnUs, ttl).hold(time.Hour).at(now.Add(5*time.Second)))
	res := apply(t, s, ev(uid, ActivityTurnUser, ttl).at(now.Add(4*time.Second)))
	turn, _, err := s.Turn(ctx, uid)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stale != 1 || !turn.Ours {
		t.Fatalf("a turn to the user 1s older than the stored turn to us: %+v, turn %+v, deadline in %v; want it stale, still ours",
			res, turn, score(t, s, uid).Sub(now))
	}
}

// TestAttack23SocketCloseForgetsOurTurn: the user waits for us (the
// platform passed the turn to us: queued for an agent). They close the
// chat window, a normal close of their last WebSocket (End), and open it
// again a moment later, while still in the queue. The conversation did
// not end, and the platform, which sees no change, sends no new turn. But
// End shares endSession with the platform's `end`, which deletes the
// turn state: the reopened chat's ping finds none, the clock runs, and
// the user still waiting for us is guided a TTL later. The promise
// broken: never a guide to someone waiting for us.
func TestAttack23SocketCloseForgetsOurTurn(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Minute
	uid := "attack23-reopen"
	apply(t, s, ev(uid, ActivityTurnUs, ttl).hold(time.Hour))
	if err := s.End(ctx, uid); err != nil { // the last WebSocket closed with 1000
		t.Fatal(err)
	}
	if _, err := s.Renew(ctx, uid, DefaultSegment, ttl, ClockPresence); err != nil { // reopened: a ping
		t.Fatal(err)
	}
	now := redisNow(t, s.rdb)
	if d := score(t, s, uid); !near(d, now.Add(time.Hour+ttl), 2*time.Second) {
		t.Fatalf("a ping after the chat was closed and reopened while waiting for us: deadline in %v, want still parked, %v",
			d.Sub(now), time.Hour+ttl)
	}
}

// TestAttack23OldActiveStartsFreshSilence: an `active` of an hour ago
// reaches us for a user we hold no state of: the feed's first run reads
// the activity topic from its start (ConsumeResetOffset AtStart, days of
// retention), or the group's offsets expired, or the consumer was down
// for an hour. The user was active then and has been silent since: their
// silence began a TTL after it, long past. But the grant counts the TTL
// from Redis's now, not from the event's time, so the replay starts a
// fresh silence for every user of the backlog, and each is guided a TTL
// from now: an hour late, as if new, past the consumer's too-old check
// (which reads the deadline). The promise broken: on time, and a stale
// event changing nothing.
func TestAttack23OldActiveStartsFreshSilence(t *testing.T) {
	s, _ := newStore(t)
	const ttl = time.Minute
	uid := "attack23-replayed"
	now := redisNow(t, s.rdb)
	at := now.Add(-time.Hour)
	apply(t, s, ev(uid, ActivityActive, ttl).at(at))
	if d := score(t, s, uid); d.After(at.Add(ttl + time.Second)) {
		t.Fatalf("an active of an hour ago: deadline in %v from now, want at most a TTL after the event (%v ago)",
			d.Sub(now), now.Sub(at.Add(ttl)))
	}
}
