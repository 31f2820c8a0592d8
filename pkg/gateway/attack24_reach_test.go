package gateway

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttack24RenewalLostBehindLateRoundTrip: a busy Redis answers every
// round trip, late. Pings keep coming; the renewal queue fills, and a
// ping's renewal that found no room for the queue wait fails, on the
// renewer's feeder, without a round trip: OnFlush never hears of it. The
// connection recorded that grant "so that a resync after an outage
// restores it even if it fails" (conn.renew). Before, the late round trip
// itself counted as a failure and a resync followed; now a late round
// trip owes only a record, so nothing ever restores the lost grant. A
// user whose last ping was that one keeps the deadline of the ping before,
// and is guided a TTL after it: while the blind interval's grace runs out
// before a TTL has passed since their last ping.
//
// The renewer and reach are wired as New wires them, with a queue of one
// so that a test need not open 8192 connections to fill it.
func TestAttack24RenewalLostBehindLateRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	ks, err := session.NewKeyspace(redistest.Prefix(t))
	if err != nil {
		t.Fatal(err)
	}
	store := session.NewStore(redistest.Client(t, srv), ks)
	r := newReach(2*time.Millisecond, stallAfter(100*time.Millisecond), nil)
	renewer := session.NewRenewer(store, session.RenewerConfig{
		FlushInterval: time.Millisecond,
		MaxBatch:      1,
		QueueSize:     1,
		QueueWait:     200 * time.Millisecond,
		Instance:      "gw-a",
		OnFlush:       func(_ int, took time.Duration, err error) { r.flushed(took, err) },
		OnDropped:     r.dropped,
	})
	r.waiting = renewer.Waiting
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); renewer.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Warm the script cache, so the late round trip is the only thing odd.
	if _, err := renewer.Renew(ctx, "warm", "default", 10*time.Second, ""); err != nil {
		t.Fatal(err)
	}

	type outcome struct {
		uid string
		err error
	}
	results := make(chan outcome, 8)
	var wg sync.WaitGroup
	renew := func(uid string) {
		wg.Add(1)
		renewer.RenewAsync(uid, "default", 10*time.Second, "", func(_ time.Time, err error) {
			results <- outcome{uid, err}
			wg.Done()
		})
	}
	// Redis busy: it answers, but late (well under the round trip's
	// 5s timeout): one round trip in flight, one renewal queued, the rest
	// wait for room.
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	for i := range 4 {
		renew(fmt.Sprintf("u%d", i))
	}
	// Real time must pass: a round trip late past stallAfter, and the
	// queue wait of the renewals with no room.
	var failed []string
	deadline := time.After(5 * time.Second)
	for len(failed) == 0 {
		select {
		case o := <-results:
			if o.err != nil {
				failed = append(failed, o.uid)
			}
		case <-deadline:
			t.Fatal("no renewal failed for want of room in the queue")
		}
	}
	// The round trip in flight turns late, not failed (that takes 5s).
	waitUntil(t, "the round trip in flight late", func() bool {
		w := renewer.Waiting()
		return !w.IsZero() && time.Since(w) > r.slow+200*time.Millisecond
	})
	srv.Resume()
	resumed = true
	wg.Wait()
	close(results)
	for o := range results {
		if o.err != nil {
			failed = append(failed, o.uid)
		}
	}
	if r.unrecorded().IsZero() {
		t.Fatal("a round trip 1s late: no outage owed a record (the precondition of this test)")
	}
	if n := r.failureCount(); n == 0 {
		t.Errorf("renewals of %v failed (no room behind a late round trip), and no resync is owed (failures %d): "+
			"their grants are never written, and their users lapse a TTL after their ping before", failed, n)
	}
}
