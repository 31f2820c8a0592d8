//go:build linux

package wsread

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAttackWokenWorkerKeepsBusySet: two connections' messages become
// ready while the turn's worker waits in the netpoller for a quiet set.
// It wakes with both in the set, takes one and, because it had to wait,
// keeps the turn and handles that one itself. The other was ready before
// the handler began and other workers are idle, yet nobody takes it: it
// waits for the handler to return, or for the watch (5 to 10 ms) if the
// handler is slow. A ping behind a renewal that takes a few milliseconds
// (under the watch's reach) waits that long, with workers to spare; in a
// busy moment many do. Here the first message's handler waits for the
// second one: it must arrive without the watch ending the turn.
func TestAttackWokenWorkerKeepsBusySet(t *testing.T) {
	// One P: the worker woken by the first write runs only once the test
	// goroutine blocks, so both messages are in the set by then, as they
	// are whenever a burst lands while a worker wakes.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	type round struct {
		mu                 sync.Mutex
		first              string
		takenAtFirst       int64
		takenAtSecond      int64
		second             chan struct{}
		secondWhileFirstIn bool
	}
	var cur atomic.Pointer[round]
	var ts *testServer
	ts = startServer(t, Config{Mode: ModeEpoll, Workers: 4}, func(r *recorder) {
		r.onMessage = func(_ *recorder, _ int, data []byte) bool {
			rd := cur.Load()
			rd.mu.Lock()
			if rd.first == "" {
				rd.first = string(data)
				rd.takenAtFirst = ts.s.p.taken.Load()
				rd.mu.Unlock()
				// The first handler waits for the other message (the
				// deadline only bounds a broken run).
				select {
				case <-rd.second:
					rd.mu.Lock()
					rd.secondWhileFirstIn = true
					rd.mu.Unlock()
				case <-time.After(20 * time.Second):
				}
				return true
			}
			rd.takenAtSecond = ts.s.p.taken.Load()
			rd.mu.Unlock()
			close(rd.second)
			return true
		}
	})
	a := dialRaw(t, ts.url, nil)
	ra := ts.next(t)
	b := dialRaw(t, ts.url, nil)
	rb := ts.next(t)
	for _, r := range []*recorder{ra, rb} {
		waitFor(t, "registration", func() bool { r.c.mu.Lock(); defer r.c.mu.Unlock(); return r.c.registered })
	}
	const rounds = 5
	failed := 0
	for i := range rounds {
		rd := &round{second: make(chan struct{})}
		cur.Store(rd)
		// Let the workers settle: the turn's worker parked on the quiet
		// set, as it is once the watch rests (nothing handled for a while).
		waitFor(t, "the watch resting", ts.s.p.watchIdle.Load)
		a.write(t, masked(opText, true, fmt.Sprint("a", i)))
		b.write(t, masked(opText, true, fmt.Sprint("b", i)))
		waitFor(t, "both messages", func() bool { return len(ra.messages()) == i+1 && len(rb.messages()) == i+1 })
		rd.mu.Lock()
		if !rd.secondWhileFirstIn {
			rd.mu.Unlock()
			waitFor(t, "the first handler's end", func() bool {
				rd.mu.Lock()
				defer rd.mu.Unlock()
				return rd.secondWhileFirstIn
			})
			rd.mu.Lock()
		}
		if rd.takenAtSecond != rd.takenAtFirst {
			failed++
			t.Logf("round %d: the other message was ready with %q yet was read only after the watch ended the turn of its handler (%d turns ended)",
				i, rd.first, rd.takenAtSecond-rd.takenAtFirst)
		}
		rd.mu.Unlock()
	}
	// A round can need the watch on a busy machine, when the test's
	// goroutine is held up between its two writes and the worker wakes
	// for the first alone; a worker that keeps its turn with the second
	// ready needs it in every round.
	if failed == rounds {
		t.Errorf("%d of %d rounds needed the watch", failed, rounds)
	}
}

// TestAttackCloseDuringRunEnd: connections closed here (ws.Close) while
// Run ends. Every such end is now dispatched to a goroutine of its own
// (spawned.Go), also while Run waits for those goroutines
// (spawned.Wait) and after it went on to its shutdown: an Add racing the
// Wait is the WaitGroup's misuse (a data race, or the fatal "WaitGroup is
// reused before previous Wait has returned"), and a handle that runs
// beside the shutdown calls Closed for a connection the shutdown has
// already ended (the handle does not look at ended). Each connection must
// get Closed exactly once, with net.ErrClosed, and Run must return.
// (Ends dispatched after the workers stopped took the same path before
// the workers took turns; now every end does.)
func TestAttackCloseDuringRunEnd(t *testing.T) {
	for i := range 40 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			ts, stop := runServer(t, Config{Mode: ModeEpoll, Workers: 2}, nil)
			var recs []*recorder
			for range 30 {
				dialRaw(t, ts.url, nil)
				r := ts.next(t)
				waitFor(t, "registration", func() bool { r.c.mu.Lock(); defer r.c.mu.Unlock(); return r.c.registered })
				recs = append(recs, r)
			}
			var wg sync.WaitGroup
			wg.Go(stop)
			for _, r := range recs {
				wg.Go(func() { r.c.WS().Close() })
			}
			wg.Wait()
			for j, r := range recs {
				waitFor(t, "Closed", func() bool { return len(r.closes()) > 0 })
				if cl := r.closes(); len(cl) != 1 || !errors.Is(cl[0], net.ErrClosed) {
					t.Fatalf("connection %d: Closed %d times: %v", j, len(cl), cl)
				}
			}
		})
	}
}
