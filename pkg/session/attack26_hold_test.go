package session

import (
	"slices"
	"testing"
	"time"
)

// TestAttack26HoldEachCountsADuplicateTwice proves that HoldEach, which
// now says of each timeout whether it was held by matching the uids
// hold.lua returns, reports a timeout listed twice as held twice though
// Redis held it once, and that Hold, which returned how many Redis held
// (1 before this change), now returns 2. A batch of expired events can
// list a uid twice (see the listener's judgeFound, which holds every
// duplicate an outage rule holds), so the listener counts one hold twice
// in stillthere_listener_held_total and writes two "held" entries to the
// user's timeline for one hold.
func TestAttack26HoldEachCountsADuplicateTwice(t *testing.T) {
	s, ctx := newStore(t)
	last := renewVia(t, s, "gw-1", "dup", 50*time.Millisecond)
	redisPast(t, s.rdb, last)
	due, now, err := s.Due(ctx, 100)
	if err != nil || len(due) != 1 {
		t.Fatalf("Due = %+v, %v; want 1", due, err)
	}
	e := due[0]
	release := now.Add(time.Hour)
	held, err := s.HoldEach(ctx, []Expired{e, e}, func(Expired) time.Time { return release })
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := s.rdb.ZCard(ctx, s.ks.HoldKey(Bucket("dup"))).Result(); n != 1 {
		t.Fatalf("hold set holds %d, want 1", n)
	}
	if want := []bool{true, false}; !slices.Equal(held, want) {
		t.Errorf("HoldEach of one timeout listed twice = %v, want %v: Redis held it once", held, want)
	}

	// Hold's count, as before this change: how many Redis held.
	last = renewVia(t, s, "gw-1", "dup2", 50*time.Millisecond)
	redisPast(t, s.rdb, last)
	due, now, err = s.Due(ctx, 100)
	if err != nil || len(due) != 1 {
		t.Fatalf("Due = %+v, %v; want 1", due, err)
	}
	if n, err := s.Hold(ctx, []Expired{due[0], due[0]}, now.Add(time.Hour)); err != nil || n != 1 {
		t.Errorf("Hold of one timeout listed twice = %d, %v; want 1", n, err)
	}
}
