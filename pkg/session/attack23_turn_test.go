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
