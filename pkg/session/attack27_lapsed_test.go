package session

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestAttack27LapsedRestoreOnce: a resync of a lapsed grant whose ping
// came after a guided silence's deadline restores it between the stages,
// as a new silence. Two gateways of the user (phone and laptop, both cut
// off in the outage) hand over such grants, one after the other, and a
// gateway may hand over the same grant again after another outage. The new
// silence is guided once: once the restored timeout is guided, a resync of
// a ping older than it (the other gateway's, or the same one again) is
// skipped, and the restored silence's next stage stays.
func TestAttack27LapsedRestoreOnce(t *testing.T) {
	s, ctx := newStore(t)
	renewer := func(inst string) *Renewer {
		r := NewRenewer(s, RenewerConfig{Instance: inst})
		rctx, stop := context.WithCancel(ctx)
		ran := make(chan struct{})
		go func() { defer close(ran); r.Run(rctx) }()
		t.Cleanup(func() { stop(); <-ran })
		return r
	}
	gwA, gwB := renewer("gw-a"), renewer("gw-b")
	const uid = "two-gateways"
	b := Bucket(uid)
	resync := func(r *Renewer, at time.Time) {
		t.Helper()
		ago := redisNow(t, s.rdb).Sub(at)
		if _, err := r.Resync(ctx, []Grant{{UID: uid, Segment: DefaultSegment, Left: -time.Millisecond, Ago: ago}}); err != nil {
			t.Fatal(err)
		}
	}
	type state struct {
		score float64
		stage string
	}
	read := func() state {
		t.Helper()
		score, err := s.rdb.ZScore(ctx, s.ks.IndexKey(b), uid).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		stage, err := s.rdb.HGet(ctx, s.ks.StageKey(b), uid).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return state{score, stage}
	}
	// guide settles the user's due stage 1 with a close an hour later.
	guide := func() Expired {
		t.Helper()
		e := dueOne(t, s, uid, 2*time.Second, sweepAll(s))
		if e.Stage != 1 {
			t.Fatalf("due as stage %d, want 1", e.Stage)
		}
		e.NextDue = e.Due.Add(time.Hour)
		if err := s.Settle(ctx, []Expired{e}); err != nil {
			t.Fatal(err)
		}
		return e
	}

	// The first silence, guided; its close is an hour away.
	deadline, err := s.Renew(ctx, uid, DefaultSegment, 100*time.Millisecond, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	redisPast(t, s.rdb, deadline)
	first := guide()
	// Both devices answered the reminder in an outage; their pings never
	// landed, and the grants ran out in it. Real time must pass: the
	// pings come after the silence's deadline.
	redisPast(t, s.rdb, first.Deadline.Add(50*time.Millisecond))
	now := redisNow(t, s.rdb)
	atA, atB := now.Add(-20*time.Millisecond), now.Add(-10*time.Millisecond)

	resync(gwA, atA)
	if st := read(); st.stage != "" || st.score == 0 {
		t.Fatalf("after gw-a's resync: %+v, want restored as a new silence, due", st)
	}
	second := guide()
	if !second.Deadline.After(first.Deadline) {
		t.Fatalf("restored silence's deadline %v, not after the first's %v", second.Deadline, first.Deadline)
	}
	guided := read()

	resync(gwB, atB) // the laptop's later ping, older than the restored silence
	if st := read(); st != guided {
		t.Errorf("gw-b's resync after the restored silence was guided: %+v, want it untouched %+v (a second reminder, or its close dropped)", st, guided)
	}
	resync(gwA, atA) // the same grant again, after another outage
	if st := read(); st != guided {
		t.Errorf("gw-a's second resync: %+v, want it untouched %+v", st, guided)
	}
}
