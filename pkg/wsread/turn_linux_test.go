//go:build linux

package wsread

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// holdServer is an epoll server with workers whose handlers block on the
// message "hold" until the test ends.
func holdServer(t *testing.T, workers int) *testServer {
	release := make(chan struct{})
	ts := startServer(t, Config{Mode: ModeEpoll, Workers: workers}, func(r *recorder) {
		r.onMessage = func(_ *recorder, _ int, data []byte) bool {
			if string(data) == "hold" {
				<-release
			}
			return true
		}
	})
	// Before the server's own cleanup, which waits for the handlers.
	t.Cleanup(func() { close(release) })
	return ts
}

// holdOn is a setup for recorders whose handlers block on the message
// "hold", each saying so on held (room for n), until release (once or
// more). The caller has the test's cleanup call release once the server
// is up, so that it runs before the server's own, which waits for the
// handlers.
func holdOn(n int) (setup func(*recorder), held chan struct{}, release func()) {
	held, gate := make(chan struct{}, n), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	setup = func(r *recorder) {
		r.onMessage = func(_ *recorder, _ int, data []byte) bool {
			if string(data) == "hold" {
				held <- struct{}{}
				<-gate
			}
			return true
		}
	}
	return setup, held, release
}

// TestSlowHandlerLosesTheTurn: a worker keeps its turn at the set while
// it handles a connection of a quiet set. Its handler blocks: the watch,
// resting until then, must hand the set to the other worker, or no other
// connection is read until the handler returns.
func TestSlowHandlerLosesTheTurn(t *testing.T) {
	ts := holdServer(t, 2)
	held := dialRaw(t, ts.url, nil)
	heldRec := ts.next(t)
	other := dialRaw(t, ts.url, nil)
	otherRec := ts.next(t)
	// The watch rests while nothing is handled: the handle must wake it.
	waitFor(t, "the watch resting", ts.s.p.watchIdle.Load)
	held.write(t, masked(opText, true, "hold"))
	waitFor(t, "the handler blocked", func() bool { return len(heldRec.messages()) == 1 })
	taken := ts.s.p.taken.Load()
	for i := range 5 {
		other.write(t, masked(opText, true, fmt.Sprint(i)))
		waitFor(t, "a message of another connection while a handler blocks", func() bool {
			return len(otherRec.messages()) == i+1
		})
	}
	if ts.s.p.taken.Load() == taken {
		// The blocked one was taken from a busy set, whose turn was
		// handed on before its handler: fine, but not what this tests.
		t.Log("the watch ended no turn")
	}
}

// TestBusySetBehindBlockedHandler: many connections' messages come at once
// while one handler blocks; whichever worker took the blocked one, every
// other message is read meanwhile.
func TestBusySetBehindBlockedHandler(t *testing.T) {
	ts := holdServer(t, 3)
	const n = 40
	clients, recs := dialMany(t, ts, n)
	for round := range 3 {
		for i, c := range clients {
			msg := "m"
			if round == 0 && i == n/2 {
				msg = "hold"
			}
			c.write(t, masked(opText, true, msg))
		}
		for i, r := range recs {
			want := round + 1
			if i == n/2 {
				want = 1 // its handler blocks; its later messages wait
			}
			waitFor(t, "every other connection's messages", func() bool { return len(r.messages()) == want })
		}
	}
}

// TestBurstOnOneWorker: many connections' messages at once, on a single
// worker: its turn takes them in one wait, and it must handle every one
// it left for the workers before it waits on the set again, where nothing
// more comes until they are read.
func TestBurstOnOneWorker(t *testing.T) {
	ts := startServer(t, Config{Mode: ModeEpoll, Workers: 1}, nil)
	const n = 50
	clients, recs := dialMany(t, ts, n)
	for round := range 5 {
		for _, c := range clients {
			c.write(t, masked(opText, true, fmt.Sprint(round)))
		}
		for _, r := range recs {
			waitFor(t, "every connection's message", func() bool { return len(r.messages()) == round+1 })
		}
	}
}

// TestTurnHandedBackAndForth: handlers that overrun the watch now and
// then, on one worker and on several, with messages from many
// connections, each sent once the one before it was read (so the set is
// often quiet, and slow handlers may hold their turn until the watch ends
// it): every message arrives, in order per connection, and the turn is
// never ended twice (the second hand-on would block: one turn, in a
// channel of one).
func TestTurnHandedBackAndForth(t *testing.T) {
	for _, workers := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(workers, " workers"), func(t *testing.T) {
			var slow atomic.Int64
			ts := startServer(t, Config{Mode: ModeEpoll, Workers: workers}, func(r *recorder) {
				r.onMessage = func(_ *recorder, _ int, data []byte) bool {
					if data[0] == 's' {
						slow.Add(1)
						// A slow handler, past two looks of the watch: real
						// time must pass, the watch ticks by the real clock.
						time.Sleep(3 * watchEvery)
					}
					return true
				}
			})
			const conns, each = 8, 30
			var wg sync.WaitGroup
			recs := make([]*recorder, conns)
			clients := make([]*rawClient, conns)
			for i := range conns {
				clients[i] = dialRaw(t, ts.url, nil)
				recs[i] = ts.next(t)
			}
			for i, c := range clients {
				wg.Go(func() {
					for j := range each {
						kind := "q"
						if (i+j)%10 == 0 {
							kind = "s"
						}
						if _, err := c.nc.Write(masked(opText, true, fmt.Sprintf("%s%d", kind, j))); err != nil {
							t.Error(err)
							return
						}
						if !holdsWithin(20*time.Second, func() bool { return len(recs[i].messages()) > j }) {
							t.Errorf("connection %d: message %d not read", i, j)
							return
						}
					}
				})
			}
			wg.Wait()
			for i, r := range recs {
				waitFor(t, "every message", func() bool { return len(r.messages()) == each })
				for j, m := range r.messages() {
					if m[1:] != fmt.Sprint(j) {
						t.Fatalf("connection %d: message %d is %q", i, j, m)
					}
				}
			}
			// Whether a slow handler began in a kept turn (so that the watch
			// ended it) is up to timing; TestSlowHandlerLosesTheTurn makes
			// sure of one.
			t.Logf("%d slow handlers, %d turns ended by the watch", slow.Load(), ts.s.p.taken.Load())
		})
	}
}

// TestCloseDuringHandleEndsWithErrClosed: Server.Close from within a
// connection's handler (as from any goroutine while a worker is in one).
// Close releases the epoll set before Run's end has begun: the handler's
// re-arm then fails, and the connection must still end as every
// connection does at Run's end, once, with net.ErrClosed, not with the
// re-arm's error.
func TestCloseDuringHandleEndsWithErrClosed(t *testing.T) {
	// One P: the handler returns and re-arms before Run's goroutine hears
	// of the Close.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var s atomic.Pointer[Server]
	ts, stop := runServer(t, Config{Mode: ModeEpoll, Workers: 2}, func(r *recorder) {
		r.onMessage = func(_ *recorder, _ int, data []byte) bool {
			if string(data) == "close" {
				s.Load().Close()
			}
			return true
		}
	})
	s.Store(ts.s)
	c := dialRaw(t, ts.url, nil)
	rec := ts.next(t)
	c.write(t, masked(opText, true, "close"))
	waitFor(t, "the message", func() bool { return len(rec.messages()) == 1 })
	stop()
	if got := rec.closes(); len(got) != 1 || !errors.Is(got[0], net.ErrClosed) {
		t.Fatalf("Closed with %v, want once, net.ErrClosed", got)
	}
}

// registered waits until r's connection is in the set.
func registered(t *testing.T, r *recorder) {
	t.Helper()
	waitFor(t, "registration", func() bool { r.c.mu.Lock(); defer r.c.mu.Unlock(); return r.c.registered })
}

// pollerStacks is the stacks of the goroutines in the poller.
func pollerStacks() []byte {
	buf := make([]byte, 1<<20)
	var out bytes.Buffer
	for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
		if bytes.Contains(g, []byte("wsread.(*poller)")) {
			out.Write(g)
			out.WriteString("\n\n")
		}
	}
	return out.Bytes()
}
