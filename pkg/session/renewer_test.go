package session

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

func TestRenewerBatchesConcurrentRenewals(t *testing.T) {
	t.Run("single redis", func(t *testing.T) {
		s, ctx := newStore(t)
		testBatching(t, s, ctx)
	})
	t.Run("redis cluster", func(t *testing.T) {
		s, ctx := newClusterStore(t)
		testBatching(t, s, ctx)
	})
}

func testBatching(t *testing.T, s *Store, ctx context.Context) {
	var flushes, renewals atomic.Int64
	r := NewRenewer(s, RenewerConfig{
		FlushInterval: 5 * time.Millisecond,
		OnFlush: func(size int, _ time.Duration, err error) {
			if err != nil {
				t.Errorf("flush: %v", err)
			}
			flushes.Add(1)
			renewals.Add(int64(size))
		},
	})
	rctx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { r.Run(rctx); close(ran) }()

	const conns, each = 200, 5
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			uid := "u" + itoa(i)
			for range each {
				d, err := r.Renew(ctx, uid, "default", time.Minute, ClockPresence)
				if err != nil || time.Until(d) < 50*time.Second {
					t.Errorf("Renew(%s) = %v, %v", uid, d, err)
					return
				}
			}
		})
	}
	wg.Wait()
	cancel()
	<-ran

	if renewals.Load() != conns*each {
		t.Fatalf("flushed %d renewals, want %d", renewals.Load(), conns*each)
	}
	perTrip := float64(renewals.Load()) / float64(flushes.Load())
	t.Logf("%d renewals in %d round trips: %.1f per round trip", renewals.Load(), flushes.Load(), perTrip)
	if perTrip < 2 {
		t.Errorf("%.1f renewals per round trip under 200 concurrent renewers: not batching", perTrip)
	}
	for _, uid := range []string{"u0", "u199"} {
		if live, _ := s.Live(ctx, uid); !live {
			t.Errorf("session %s not renewed", uid)
		}
	}
	if _, err := r.Renew(ctx, "late", "default", time.Minute, ClockPresence); !errors.Is(err, ErrRenewerStopped) {
		t.Errorf("Renew after stop = %v, want ErrRenewerStopped", err)
	}
}

func TestRenewerStopFlushesQueued(t *testing.T) {
	s, ctx := newStore(t)
	// A long flush interval: only the stop can flush these.
	r := NewRenewer(s, RenewerConfig{FlushInterval: time.Hour, MaxBatch: 1000})
	type result struct {
		uid string
		err error
	}
	results := make(chan result, 10)
	for i := range 10 {
		go func() {
			uid := "q" + itoa(i)
			_, err := r.Renew(ctx, uid, "default", time.Minute, ClockPresence)
			results <- result{uid, err}
		}()
	}
	// They queue, then Run takes them into its batch; only then stop it.
	eventually(t, 5*time.Second, "10 renewals queued", func() bool { return len(r.reqs) == 10 })
	rctx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { r.Run(rctx); close(ran) }()
	eventually(t, 5*time.Second, "Run to take the queued renewals", func() bool { return len(r.reqs) == 0 })
	cancel()
	<-ran
	accepted := 0
	for range 10 {
		res := <-results
		switch {
		case res.err == nil:
			accepted++
			if live, _ := s.Live(ctx, res.uid); !live {
				t.Errorf("renewal of %s reported done but not in Redis", res.uid)
			}
		case !errors.Is(res.err, ErrRenewerStopped):
			t.Errorf("renewal of %s: %v", res.uid, res.err)
		}
	}
	if accepted == 0 {
		t.Fatal("no queued renewal was flushed on stop")
	}
}

func TestRenewerSurvivesScriptFlush(t *testing.T) {
	s, ctx := newStore(t)
	r := NewRenewer(s, RenewerConfig{})
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.Run(rctx)
	// As after a Redis restart: the script cache is empty.
	if err := s.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Renew(ctx, "x", "default", time.Minute, ClockPresence); err != nil {
		t.Fatalf("Renew after SCRIPT FLUSH: %v", err)
	}
	if _, err := r.Renew(ctx, "y", "default", time.Minute, ClockPresence); err != nil {
		t.Fatalf("second Renew: %v", err)
	}
}

// TestRenewerEndsInBatches: many users leaving at once end their
// sessions in shared round trips, interleaved with renewals, and each
// ended session is gone with its index entry while the renewed ones stay.
func TestRenewerEndsInBatches(t *testing.T) {
	s, ctx := newStore(t)
	var flushes atomic.Int64
	r := NewRenewer(s, RenewerConfig{OnFlush: func(_ int, _ time.Duration, err error) {
		if err != nil {
			t.Errorf("flush: %v", err)
		}
		flushes.Add(1)
	}})
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.Run(rctx)
	// After a Redis restart the end script is not cached either.
	if err := s.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	uid := func(i int) string { return "u" + strconv.Itoa(i) }
	for i := range n {
		if _, err := s.Renew(ctx, uid(i), "default", time.Minute, ClockPresence); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				err = r.End(ctx, uid(i))
			} else {
				_, err = r.Renew(ctx, uid(i), "default", time.Minute, ClockPresence)
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for i := range n {
		live, err := s.Live(ctx, uid(i))
		if err != nil {
			t.Fatal(err)
		}
		_, zerr := s.rdb.ZScore(ctx, s.ks.IndexKey(Bucket(uid(i))), uid(i)).Result()
		indexed := zerr == nil
		if want := i%2 == 1; live != want || indexed != want {
			t.Fatalf("%s: live %v, indexed %v; want %v", uid(i), live, indexed, want)
		}
	}
	if f := flushes.Load(); f > n/10 {
		t.Errorf("%d round trips for %d ends and renewals, want them batched", f, n)
	}
}

// TestRenewAsync: RenewAsync returns at once and calls back with what
// Renew returns, in the order asked; while Redis hangs (a paused
// redis-server) and the queue is full, it still returns at once, and the
// renewals that found no room fail after QueueWait, those in the queue
// when their round trip does. Renewals after Run stopped fail at once.
func TestRenewAsync(t *testing.T) {
	srv := redistest.Start(t)
	ks, err := NewKeyspace(redistest.Prefix(t))
	if err != nil {
		t.Fatal(err)
	}
	// A short read timeout, so that the round trip to the paused server
	// fails well within the test.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	s := NewStore(rdb, ks)
	const queue, wait = 4, 300 * time.Millisecond
	r := NewRenewer(s, RenewerConfig{QueueSize: queue, MaxBatch: queue, QueueWait: wait})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { r.Run(ctx); close(ran) }()

	type outcome struct {
		i        int
		deadline time.Time
		err      error
		at       time.Time
	}
	results := make(chan outcome, 100)
	renew := func(i int) {
		r.RenewAsync("u"+itoa(i), "default", time.Minute, ClockPresence, func(d time.Time, err error) {
			results <- outcome{i, d, err, time.Now()}
		})
	}
	for i := range 10 {
		renew(i)
	}
	for want := range 10 {
		o := <-results
		if o.i != want || o.err != nil || time.Until(o.deadline) < 50*time.Second {
			t.Fatalf("callback %d: %+v, want renewal %d with a deadline a minute ahead", want, o, want)
		}
	}

	// Redis hangs: the first round trip holds up a batch, the queue
	// fills, and the rest wait for room; no call waits for any of it.
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	const n = 40
	start := time.Now()
	for i := range n {
		renew(100 + i)
	}
	if took := time.Since(start); took > wait {
		t.Fatalf("%d calls took %v while Redis hung, want each to return at once", n, took)
	}
	failed, noRoom := 0, 0
	for failed < n {
		select {
		case o := <-results:
			if o.err == nil {
				t.Fatalf("renewal %d succeeded on a paused Redis", o.i)
			}
			if o.at.Sub(start) < wait {
				t.Fatalf("renewal %d failed after %v, before any wait was over: %v", o.i, o.at.Sub(start), o.err)
			}
			if strings.Contains(o.err.Error(), "no room in the renewal queue") {
				noRoom++
			}
			failed++
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d renewals settled while Redis hung", failed, n)
		}
	}
	if noRoom == 0 {
		t.Errorf("no renewal waited for room in the queue: the test did not fill it")
	}
	srv.Resume()
	resumed = true

	cancel()
	<-ran
	var stopped error
	r.RenewAsync("late", "default", time.Minute, ClockPresence, func(_ time.Time, err error) { stopped = err })
	if !errors.Is(stopped, ErrRenewerStopped) {
		t.Fatalf("renewal after stop: %v, want ErrRenewerStopped at once", stopped)
	}
}
