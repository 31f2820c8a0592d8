package session

import (
	"context"
	"testing"
	"time"
)

// TestAttackSessionValueSegmentWithSlash: the session key's value holds
// the segment before a "/" (sessionFormat), so a segment holding "/"
// would be read back split: the grant of instance "b" after one of
// "eu/b" of no instance took "b" for the via the hash holds and wrote
// none, and an event of no segment took "eu" for the user's segment.
// The token, the activity feed and the push API refused such a segment
// already; Store.Renew and the Renewer took it as given. Now every way
// to a grant refuses it, with an error naming it, and writes nothing.
func TestAttackSessionValueSegmentWithSlash(t *testing.T) {
	s, ctx := newStore(t)
	const uid, bad = "slash", "eu/b"
	r := runRenewer(t, s)
	if _, err := s.Renew(ctx, uid, bad, time.Minute, ClockPresence); err == nil {
		t.Error("Store.Renew took segment eu/b")
	}
	if _, err := r.Renew(ctx, uid, bad, time.Minute, ClockPresence); err == nil {
		t.Error("Renewer.Renew took segment eu/b")
	}
	async := make(chan error, 1)
	r.RenewAsync(uid, bad, time.Minute, ClockPresence, func(_ time.Time, err error) { async <- err })
	if err := <-async; err == nil {
		t.Error("Renewer.RenewAsync took segment eu/b")
	}
	if _, err := s.ApplyActivity(ctx, "gw-a", SegmentRules{}, []Activity{ev(uid, ActivityActive, time.Minute).segment(bad)}); err == nil {
		t.Error("ApplyActivity took segment eu/b")
	}
	if n := s.rdb.Exists(ctx, s.ks.SessionKey(uid), s.ks.RenewedKey(uid)).Val(); n != 0 {
		t.Fatalf("%d of the user's keys written by refused grants", n)
	}
	// A resync sends the grants beside a bad one, and says the bad one.
	n, err := r.Resync(context.Background(), []Grant{
		{UID: uid, Segment: bad, Left: time.Minute, Clock: ClockPresence},
		{UID: "fine", Segment: DefaultSegment, Left: time.Minute, Clock: ClockPresence},
	})
	if n != 1 || err == nil {
		t.Fatalf("a resync of a bad grant and a good one: %d sent, %v; want the good one sent and an error", n, err)
	}
	if live, _ := s.Live(ctx, "fine"); !live {
		t.Error("the good grant beside the bad one was not restored")
	}
	if live, _ := s.Live(ctx, uid); live {
		t.Error("the bad grant was restored")
	}
}
