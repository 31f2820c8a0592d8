package session

import (
	"context"
	"testing"
	"time"
)

// TestAttackResyncBetweenStages: "a ping cancels the remaining stages",
// also a ping the gateway could only write later, by a resync: Redis was
// out of reach when it came, or its cluster slot moved for longer than
// renewals are retried. Between stage 1 and a later stage the index
// entry's score is that stage's due time, not a deadline. The resync
// takes it for a later deadline already written (another device, a later
// ping) and writes nothing: the session stays gone, the renewal is not
// recorded, and the close stays scheduled, so the user who pinged after
// the reminder is closed at the old silence's close time (and gets no
// reminder for the silence their ping began).
func TestAttackResyncBetweenStages(t *testing.T) {
	s, ctx := newStore(t)
	deadline, err := s.Renew(ctx, "rita", DefaultSegment, 100*time.Millisecond, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	first := dueOne(t, s, "rita", 2*time.Second, sweepAll(s))
	// Stage 1 produced; the close is due 10 s after it.
	first.NextDue = first.Due.Add(10 * time.Second)
	if err := s.Settle(ctx, []Expired{first}); err != nil {
		t.Fatal(err)
	}
	reminded := redisNow(t, s.rdb)

	// The user pinged 100 ms ago, after the reminder, on a gateway that
	// could not write the renewal then; it resyncs the grant now: a TTL
	// of 2 s, 100 ms of it gone.
	rctx, stop := context.WithCancel(ctx)
	r := NewRenewer(s, RenewerConfig{Instance: "gw-1"})
	ran := make(chan struct{})
	go func() { defer close(ran); r.Run(rctx) }()
	defer func() { stop(); <-ran }()
	const ago = 100 * time.Millisecond
	// Real time must pass for the ping to come after the reminder.
	redisPast(t, s.rdb, reminded.Add(ago+50*time.Millisecond))
	if _, err := r.Resync(ctx, []Grant{{UID: "rita", Segment: DefaultSegment, Left: 2*time.Second - ago, Ago: ago}}); err != nil {
		t.Fatal(err)
	}

	live, err := s.Live(ctx, "rita")
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := s.LastRenewed(ctx, "rita")
	if err != nil {
		t.Fatal(err)
	}
	stage, err := s.rdb.HGet(ctx, s.ks.StageKey(Bucket("rita")), "rita").Result()
	if err == nil || !live || !renewed.After(deadline) {
		t.Fatalf("after a resync of a ping between stages: session live %v, last renewal %v (deadline %v), stage entry %q; "+
			"want the session back, the renewal recorded, and the stages left of the old silence dropped",
			live, renewed.Format("15:04:05.000"), deadline.Format("15:04:05.000"), stage)
	}
}
