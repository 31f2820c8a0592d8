package session

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestResyncLapsed: a grant that ran out while Redis was out of reach is
// restored, due just past now, only if its silence cannot have been
// handled already (see renewScript's mode "lapsed"), once.
func TestResyncLapsed(t *testing.T) {
	s, ctx := newStore(t)
	r := NewRenewer(s, RenewerConfig{Instance: "gw-1"})
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); r.Run(rctx) }()
	defer func() { stop(); <-ran }()

	const short = 100 * time.Millisecond
	// renewed renews uid for short and waits until that has run out.
	renewed := func(t *testing.T, uid string) time.Time {
		t.Helper()
		deadline, err := s.Renew(ctx, uid, DefaultSegment, short, ClockPresence)
		if err != nil {
			t.Fatal(err)
		}
		redisPast(t, s.rdb, deadline)
		return deadline.Add(-short)
	}
	// guided settles uid's stage 1, with a next stage or none.
	guided := func(t *testing.T, uid string, next time.Duration) {
		t.Helper()
		e := dueOne(t, s, uid, 2*time.Second, sweepAll(s))
		if next > 0 {
			e.NextDue = e.Due.Add(next)
		}
		if err := s.Settle(ctx, []Expired{e}); err != nil {
			t.Fatal(err)
		}
	}
	// resync hands over uid's grant of a ping at at that ran out (how
	// long ago is not used).
	resync := func(t *testing.T, uid string, at time.Time) {
		t.Helper()
		ago := redisNow(t, s.rdb).Sub(at)
		if _, err := r.Resync(ctx, []Grant{{UID: uid, Segment: DefaultSegment, Left: -time.Millisecond, Ago: ago}}); err != nil {
			t.Fatal(err)
		}
	}
	type state struct {
		score   float64 // index entry, 0 if none
		renewed time.Time
		held    bool // in the hold set or the held hash
		stage   bool
	}
	read := func(t *testing.T, uid string) state {
		t.Helper()
		b := Bucket(uid)
		var st state
		score, err := s.rdb.ZScore(ctx, s.ks.IndexKey(b), uid).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		st.score = score
		if st.renewed, err = s.LastRenewed(ctx, uid); err != nil {
			t.Fatal(err)
		}
		inHold := s.rdb.ZScore(ctx, s.ks.HoldKey(b), uid).Err() == nil
		inHeld, _ := s.rdb.HExists(ctx, s.ks.HeldKey(b), uid).Result()
		st.held = inHold || inHeld
		st.stage, _ = s.rdb.HExists(ctx, s.ks.StageKey(b), uid).Result()
		return st
	}
	// restored checks that uid's session was restored at its own
	// deadline, just before the resync, with the ping recorded as its last renewal, and returns it
	// due.
	restored := func(t *testing.T, uid string, at, before time.Time) Expired {
		t.Helper()
		after := redisNow(t, s.rdb)
		st := read(t, uid)
		// At its own deadline: it ran out a millisecond before the
		// resync (truncated to the millisecond).
		due := time.UnixMilli(int64(st.score))
		if due.Before(before.Add(-2*time.Millisecond)) || due.After(after) {
			t.Errorf("%s: due at %v, want its own deadline, a millisecond before the resync, in [%v, %v]", uid, due, before.Add(-2*time.Millisecond), after)
		}
		if st.held || st.stage {
			t.Errorf("%s: still held %v, between stages %v", uid, st.held, st.stage)
		}
		// The ping's time, as the resync counts it: how long ago it was,
		// from Redis's now when the script runs, a moment later.
		if d := st.renewed.Sub(at); d < -time.Millisecond || d > 100*time.Millisecond {
			t.Errorf("%s: last renewal %v, want the ping's %v", uid, st.renewed, at)
		}
		// Due for the listener: the session key ran out at once.
		return dueOne(t, s, uid, 2*time.Second, sweepAll(s))
	}

	// skipped checks that a resync of uid's grant of a ping at at leaves
	// Redis as it was.
	skipped := func(t *testing.T, uid string, at time.Time) {
		t.Helper()
		was := read(t, uid)
		resync(t, uid, at)
		if got := read(t, uid); got != was {
			t.Errorf("%s: %+v after the resync, want it untouched: %+v", uid, got, was)
		}
		if live, _ := s.Live(ctx, uid); live {
			t.Errorf("%s: session restored", uid)
		}
	}
	t.Run("restored after data loss", func(t *testing.T) {
		// Redis knows nothing of the user: the renewal never landed, or
		// it was lost with the data.
		at := redisNow(t, s.rdb).Add(-3 * time.Second)
		before := redisNow(t, s.rdb)
		resync(t, "lost", at)
		e := restored(t, "lost", at, before)
		// Guided once; a resync of the same grant after another outage
		// must not make it a second silence.
		if err := s.Settle(ctx, []Expired{e}); err != nil {
			t.Fatal(err)
		}
		skipped(t, "lost", at)
	})
	t.Run("restored while held", func(t *testing.T) {
		renewed(t, "held")
		e := dueOne(t, s, "held", 2*time.Second, sweepAll(s))
		if n, err := s.Hold(ctx, []Expired{e}, redisNow(t, s.rdb).Add(time.Hour)); err != nil || n != 1 {
			t.Fatalf("hold = %d, %v", n, err)
		}
		// The user pinged again, after that deadline; the renewal failed.
		at := redisNow(t, s.rdb).Add(-10 * time.Millisecond)
		before := redisNow(t, s.rdb)
		resync(t, "held", at)
		restored(t, "held", at, before)
	})
	t.Run("restored while its timeout is in the index", func(t *testing.T) {
		renewed(t, "pending")
		at := redisNow(t, s.rdb).Add(-10 * time.Millisecond)
		before := redisNow(t, s.rdb)
		resync(t, "pending", at)
		restored(t, "pending", at, before)
	})

	t.Run("skipped when a renewal is newer", func(t *testing.T) {
		// Long enough before the renewal that the resync's count of its
		// time, from how long ago it was, cannot pass it.
		pinged := redisNow(t, s.rdb).Add(-time.Second)
		renewed(t, "newer")
		skipped(t, "newer", pinged)
	})
	t.Run("skipped when already guided", func(t *testing.T) {
		renewed(t, "guided")
		guided(t, "guided", 0)
		skipped(t, "guided", redisNow(t, s.rdb).Add(-10*time.Millisecond))
	})
	t.Run("skipped when ended", func(t *testing.T) {
		if err := s.End(ctx, "ended"); err != nil {
			t.Fatal(err)
		}
		redisPast(t, s.rdb, redisNow(t, s.rdb).Add(20*time.Millisecond))
		skipped(t, "ended", redisNow(t, s.rdb).Add(-10*time.Millisecond))
	})
	t.Run("skipped between stages", func(t *testing.T) {
		// The grant handed over is the one the guided silence ran from
		// (its ping before that silence's deadline): guided already.
		at := renewed(t, "staged")
		guided(t, "staged", time.Hour)
		skipped(t, "staged", at.Add(10*time.Millisecond))
		// Also once the renewal is forgotten (a close stage due later
		// than RenewedKeep): the silence was guided all the same.
		if err := s.rdb.Del(ctx, s.ks.RenewedKey("staged")).Err(); err != nil {
			t.Fatal(err)
		}
		skipped(t, "staged", at.Add(10*time.Millisecond))
	})
	t.Run("restored between stages of a silence the ping came after", func(t *testing.T) {
		// The user was reminded, then pinged while Redis was out of
		// reach, and went quiet again: that ping ended the guided silence,
		// and began one that fell in the outage. It is owed its own
		// reminder; the old silence's close is not.
		deadline := renewed(t, "came-back").Add(short)
		guided(t, "came-back", time.Hour)
		// Real time must pass: the ping comes after the silence's deadline.
		redisPast(t, s.rdb, deadline.Add(50*time.Millisecond))
		at := redisNow(t, s.rdb).Add(-10 * time.Millisecond)
		before := redisNow(t, s.rdb)
		resync(t, "came-back", at)
		e := restored(t, "came-back", at, before)
		if e.Stage != 1 {
			t.Errorf("restored as stage %d, want the first stage of a new silence", e.Stage)
		}
	})
}
