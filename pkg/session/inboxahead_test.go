package session

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestInboxKeepsOneEntryPerGuide: a guide kept ahead of its live delivery
// and kept again on its way on (handed on, routed in after the user's
// connections ended, held and given back) is one entry, which keeps its
// lease; a keep that marks it closed replaces it; an expired entry of the
// id does not count. DropFromInboxes takes the entries of the ids it is
// given out, with their leases, and leaves the rest.
func TestInboxKeepsOneEntryPerGuide(t *testing.T) {
	s, ctx := newStore(t)
	ks := s.Keyspace()
	entry := func(id string) []byte { return []byte(`{"id":"` + id + `","uid":"ann","text":"Still there?"}`) }
	keep := func(id string, closed bool, maxAge time.Duration) int {
		t.Helper()
		n, err := s.KeepGuide(ctx, "ann", Keep{Entry: entry(id), MaxAge: maxAge, Cap: 10, TTL: time.Hour, Closed: closed})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	ids := func() (out []string, closed []string) {
		t.Helper()
		for _, raw := range s.rdb.LRange(ctx, ks.InboxKey("ann"), 0, -1).Val() {
			e, ok := decodeInboxEntry(raw)
			if !ok {
				t.Fatalf("entry %q does not parse", raw)
			}
			out = append(out, e.ID)
			if e.ClosedMS != 0 {
				closed = append(closed, e.ID)
			}
		}
		slices.Sort(out)
		return out, closed
	}

	for i, want := range []int{KeptQueued, KeptAlready, KeptAlready} {
		if n := keep("g1", false, time.Hour); n != want {
			t.Fatalf("keep %d of g1 = %d, want %d", i+1, n, want)
		}
	}
	keep("g2", false, time.Hour)
	if got, _ := ids(); !slices.Equal(got, []string{"g1", "g2"}) {
		t.Fatalf("inbox holds %v, want one entry each of g1 and g2", got)
	}

	// A connection leases g1; a keep of it again leaves the lease.
	if _, err := s.TakeInbox(ctx, "ann", 1, time.Minute, TakeWord{AgoMS: -1}); err != nil {
		t.Fatal(err)
	}
	keep("g1", false, time.Hour)
	if s.rdb.HExists(ctx, ks.InboxLeaseKey("ann"), "g1").Val() != true {
		t.Fatal("keeping g1 again took its lease away")
	}

	// Closed replaces it; keeping it unclosed after leaves it closed.
	keep("g1", true, time.Hour)
	keep("g1", false, time.Hour)
	if got, closed := ids(); !slices.Equal(got, []string{"g1", "g2"}) || !slices.Equal(closed, []string{"g1"}) {
		t.Fatalf("inbox holds %v, closed %v; want g1 (closed) and g2", got, closed)
	}

	// An expired entry of an id is no entry of it.
	keep("g3", false, time.Millisecond)
	eventually(t, 10*time.Second, "g3 expires by Redis's clock", func() bool {
		now, err := s.rdb.Time(ctx).Result()
		return err == nil && s.expiredIn(t, "ann", "g3", now)
	})
	if n := keep("g3", false, time.Hour); n != KeptQueued {
		t.Fatalf("keep g3 again = %d, want kept", n)
	}
	if got, _ := ids(); !slices.Equal(got, []string{"g1", "g2", "g3"}) {
		t.Fatalf("inbox holds %v, want g1, g2 and a fresh g3", got)
	}

	// Drops: of g1 and g3, and of an id the inbox does not hold, and of
	// a user with no inbox.
	// g1 settled (proven received), g3 not (it reached nobody).
	n, err := s.DropFromInboxes(ctx, []InboxDrop{{"ann", "g1"}, {"ann", "gone"}, {"bob", "g1"}}, DropHow{Settled: time.Minute})
	if err != nil || n != 3 {
		t.Fatalf("drops = %d, %v; want 3 calls made", n, err)
	}
	if n, err := s.DropFromInboxes(ctx, []InboxDrop{{"ann", "g3"}}, DropHow{}); err != nil || n != 1 {
		t.Fatalf("drop g3 = %d, %v", n, err)
	}
	if got, _ := ids(); !slices.Equal(got, []string{"g2"}) {
		t.Fatalf("inbox holds %v after dropping g1 and g3, want g2", got)
	}
	if s.rdb.HExists(ctx, ks.InboxLeaseKey("ann"), "g1").Val() {
		t.Fatal("g1's lease outlived its entry")
	}

	// A copy of settled g1 still on its way is not kept again; g3, taken
	// out unsettled, is.
	if n := keep("g1", false, time.Hour); n != KeptSettled {
		t.Fatalf("keep settled g1 = %d, want %d (settled)", n, KeptSettled)
	}
	if n := keep("g1", true, time.Hour); n != KeptSettled {
		t.Fatalf("keep settled g1 closed = %d, want %d (settled)", n, KeptSettled)
	}
	if n := keep("g3", false, time.Hour); n != KeptQueued {
		t.Fatalf("keep g3 after an unsettled drop = %d, want kept", n)
	}
	if got, _ := ids(); !slices.Equal(got, []string{"g2", "g3"}) {
		t.Fatalf("inbox holds %v, want g2 and g3", got)
	}

	// A keep without a cap trims nothing; one with a cap trims the oldest.
	for _, id := range []string{"n1", "n2", "n3"} {
		if _, err := s.KeepGuide(ctx, "ann", Keep{Entry: entry(id), MaxAge: time.Hour, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := ids(); len(got) != 5 {
		t.Fatalf("inbox holds %v after three keeps without a cap, want all 5", got)
	}
	if n := keep("n4", false, time.Hour); n != KeptQueued { // cap 10
		t.Fatalf("keep n4 = %d", n)
	}
	if _, err := s.KeepGuide(ctx, "ann", Keep{Entry: entry("n5"), MaxAge: time.Hour, Cap: 2, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if got, _ := ids(); !slices.Equal(got, []string{"n4", "n5"}) {
		t.Fatalf("inbox holds %v after a keep with cap 2, want the newest two", got)
	}

	// A drop that keeps closed entries leaves a close applied, and takes
	// out the rest of its id's entries.
	keep("c1", true, time.Hour)
	keep("n4", false, time.Hour)
	if _, err := s.DropFromInboxes(ctx, []InboxDrop{{"ann", "c1"}, {"ann", "n4"}}, DropHow{KeepClosed: true}); err != nil {
		t.Fatal(err)
	}
	if got, closed := ids(); !slices.Equal(got, []string{"c1", "n5"}) || !slices.Equal(closed, []string{"c1"}) {
		t.Fatalf("inbox holds %v, closed %v; want c1 (closed) and n5", got, closed)
	}

	// The mark lasts as long as it was asked for, and no longer.
	if _, err := s.DropFromInboxes(ctx, []InboxDrop{{"ann", "g2"}}, DropHow{Settled: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "g2's mark runs out", func() bool {
		return keep("g2", false, time.Hour) == KeptQueued
	})
	if ttl := s.rdb.PTTL(ctx, ks.InboxSettledKey("ann")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("settled marks live %v, want at most the longest mark", ttl)
	}
}

// expiredIn reports whether uid's inbox entry of id has expired at now.
func (s *Store) expiredIn(t *testing.T, uid, id string, now time.Time) bool {
	t.Helper()
	for _, raw := range s.rdb.LRange(t.Context(), s.ks.InboxKey(uid), 0, -1).Val() {
		if e, ok := decodeInboxEntry(raw); ok && e.ID == id {
			return e.ExpiresMS <= now.UnixMilli()
		}
	}
	return true
}

// TestInboxCloseToldToDeviceOpenBeforeIt: a close applied on one device
// and kept closed is stale by a renewal after it, except for a take by a
// connection open since before the close: that device was there and was
// never told, and its own pings are such renewals. A take by a
// connection it is stale for leaves it in the inbox, unleased: it is
// still owed to a device open since before it, whose take may come
// after (a handover of a device opened later was offered the inbox
// first, and dropped it: the close was never told).
func TestInboxCloseToldToDeviceOpenBeforeIt(t *testing.T) {
	s, ctx := newStore(t)
	ks := s.Keyspace()
	for _, tc := range []struct {
		name     string
		openedMS func(closedMS int64) int64
		handed   bool
	}{
		{"opened before the close", func(c int64) int64 { return c - 5000 }, true},
		{"opened as it was applied", func(c int64) int64 { return c }, true},
		{"opened after it", func(c int64) int64 { return c + 1 }, false},
		{"not said", func(int64) int64 { return 0 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := "u-" + strings.ReplaceAll(tc.name, " ", "-")
			entry := []byte(`{"id":"c","uid":"` + uid + `","text":"We closed this chat.","deadline_ms":1000,"stage":2,"final":true}`)
			if _, err := s.KeepGuide(ctx, uid, Keep{Entry: entry, MaxAge: time.Hour, Cap: 10, TTL: time.Hour, Closed: true}); err != nil {
				t.Fatal(err)
			}
			e, ok := decodeInboxEntry(s.rdb.LIndex(ctx, ks.InboxKey(uid), 0).Val())
			if !ok || e.ClosedMS == 0 {
				t.Fatalf("kept entry %+v, want it closed", e)
			}
			// The user renewed after the close (on any device).
			s.rdb.Set(ctx, ks.RenewedKey(uid), e.ClosedMS+1000, time.Hour)
			got, err := s.TakeInbox(ctx, uid, 4, time.Minute, TakeWord{AgoMS: -1, OpenedMS: tc.openedMS(e.ClosedMS)})
			if err != nil {
				t.Fatal(err)
			}
			if handed := len(got.Items) == 1; handed != tc.handed || len(got.Stale) != 0 {
				t.Fatalf("taken %d, stale %d; want handed %v, none dropped", len(got.Items), len(got.Stale), tc.handed)
			}
			if tc.handed {
				return
			}
			// Left, and not leased: the device open since before the close
			// takes it next.
			if n := s.rdb.LLen(ctx, ks.InboxKey(uid)).Val(); n != 1 {
				t.Fatalf("%d inbox entries after the take, want the closed one left", n)
			}
			before, err := s.TakeInbox(ctx, uid, 4, time.Minute, TakeWord{AgoMS: -1, OpenedMS: e.ClosedMS - 5000})
			if err != nil {
				t.Fatal(err)
			}
			if len(before.Items) != 1 {
				t.Fatalf("a device open since before the close took %d entries after the other take, want it", len(before.Items))
			}
		})
	}
}
