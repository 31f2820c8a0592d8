package session

import (
	"testing"
	"time"
)

// TestAttackR4LapsedLongAgo: a grant that ran out early in a long outage
// (Redis down for maintenance, a gateway cut off from it for hours while
// its users stay connected or their dropped grants are kept: both are
// kept, as lapsed, while no resync has followed the outage) is restored
// at its own deadline, now in the past by the outage's length. The
// script records the ping as the user's last renewal for RenewedKeep
// past the deadline (PX deadline-now+keep): past two hours, that is no
// time at all, and Redis refuses the SET ("invalid expire time") after
// the script has written the session, its index entry, segment and via.
// The resync fails, and is tried again every second for ever, every
// connection's grant with it (the batches after the failing one never
// sent); and since the renewal is never recorded, every try restores
// the silence again once it has been guided: one guide per silence, and
// nothing lost, both broken. Before the fix (restored just past now) the
// renewal's expiry was keep+1 ms.
func TestAttackR4LapsedLongAgo(t *testing.T) {
	s, ctx := newStore(t)
	r := runRenewer(t, s)

	const uid = "away-long"
	ttl := time.Minute
	// Its only ping was 2h5m ago, its renewal lost with Redis's data (or
	// never written: the outage had begun): it ran out 2h4m ago, in the
	// outage, which the gateway's resync follows.
	ran := RenewedKeep + 4*time.Minute
	deadline := time.Now().Add(-ran)
	// grant is the gateway's record of it, as a resync takes it now.
	grant := func() Grant {
		now := time.Now()
		return Grant{UID: uid, Segment: DefaultSegment, Left: deadline.Sub(now), Ago: now.Sub(deadline.Add(-ttl)), Taken: now}
	}
	if _, err := r.Resync(ctx, []Grant{grant()}); err != nil {
		t.Errorf("resync of a grant that ran out %v ago: %v", ran, err)
	}
	renewed, err := s.LastRenewed(ctx, uid)
	if err != nil {
		t.Fatal(err)
	}
	_, indexErr := s.rdb.ZScore(ctx, s.ks.IndexKey(Bucket(uid)), uid).Result()
	if indexErr == nil && renewed.IsZero() {
		t.Errorf("restored (an index entry) without its renewal recorded: the next resync restores the silence again")
	}
	if indexErr != nil {
		// Not restored at all: then nothing below applies.
		return
	}
	// Guided once: a resync of the same grant (the gateway tries the
	// failed resync again a second later) must not make a second silence.
	e := dueOne(t, s, uid, 2*time.Second, sweepAll(s))
	if err := s.Settle(ctx, []Expired{e}); err != nil {
		t.Fatal(err)
	}
	r.Resync(ctx, []Grant{grant()})
	if v, err := s.rdb.ZScore(ctx, s.ks.IndexKey(Bucket(uid)), uid).Result(); err == nil {
		// The listener claims it again: its dedup key (DedupTTL, 2 min)
		// catches the very same millisecond only while it lives, and the
		// gateway tries again every second for as long as the outage is
		// not followed by a completed resync.
		t.Errorf("the guided silence restored again by the resync's next try, due %v (guided at %v): a second silence",
			time.UnixMilli(int64(v)).Format("15:04:05.000"), e.Deadline.Format("15:04:05.000"))
	}
}
