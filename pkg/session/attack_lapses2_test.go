package session

import (
	"testing"
	"time"
)

// TestAttackLapsesCountLongAfterMark: a count that runs long after the
// mark its caller read now at (a batch whose claims took that long: a
// starved or paused listener process, a storm's pipelines on a slow
// Redis) must see a share another replica counted since, in the second
// it runs in. Within lapseAhead it sums up to that second; past it, it
// fails (the brake then holds what it was to count). Before, the count
// was clamped to the last key it was given, a second already past, and
// A saw 45, not 90, and let its share out beside B's.
func TestAttackLapsesCountLongAfterMark(t *testing.T) {
	s, ctx := newStore(t)
	cur, err := s.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.Lapses(ctx, cur, 10*time.Second, 45, tok()); err != nil || n != 45 {
		t.Fatalf("B's Lapses = %d, %v; want 45", n, err)
	}
	markA := cur.Add(-(lapseAhead - 5) * time.Second)
	if n, err := s.Lapses(ctx, markA, 10*time.Second, 45, tok()); err != nil || n != 90 {
		t.Errorf("A's Lapses, counted %v after its mark = %d, %v; want 90, B's share too", cur.Sub(markA), n, err)
	}
	markC := cur.Add(-(lapseAhead + 1) * time.Second)
	if n, err := s.Lapses(ctx, markC, 10*time.Second, 45, tok()); err == nil {
		t.Errorf("C's Lapses, counted %v after its mark = %d; want an error: it cannot see the shares counted since", cur.Sub(markC), n)
	}
	if v, _ := s.rdb.Get(ctx, s.ks.LapsesKey(markC.Unix())).Int(); v != 0 {
		t.Errorf("C's refused count added %d", v)
	}
}
