package session

import (
	"testing"
	"time"
)

// TestAttackLapsesMarkAheadAfterFailover: a failover to a node whose clock
// is behind the old master's by a few seconds. Replica A read its mark on
// the old master, 3 s ahead of the new one's clock, and counts its 45 on
// the new master: its count goes to its mark's second, 3 s in the new
// master's future, and it sums its mark's window (the script's clock is
// behind it). Replica B marks on the new master and counts its 45 of the
// same crowd just after: it sums from the window before its mark up to
// the second the script runs in, which is before A's. Neither sees the
// other's share, and a crowd of 90 goes out at a threshold of 50. A
// share counted into a second ahead of the clock must still be seen by a
// count after it.
func TestAttackLapsesMarkAheadAfterFailover(t *testing.T) {
	s, ctx := newStore(t)
	cur, err := s.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	markA := cur.Add(3 * time.Second) // read on the old master
	if n, err := s.Lapses(ctx, markA, 10*time.Second, 45, tok()); err != nil || n != 45 {
		t.Fatalf("A's Lapses = %d, %v; want 45", n, err)
	}
	markB, err := s.rdb.Time(ctx).Result() // read on the new master
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.Lapses(ctx, markB, 10*time.Second, 45, tok()); err != nil || n != 90 {
		t.Errorf("B's Lapses, counted after A's = %d, %v; want 90, A's share too (A counted it into %v, %v ahead of the new master's clock)",
			n, err, markA.Unix(), markA.Sub(markB).Round(time.Second))
	}
}
