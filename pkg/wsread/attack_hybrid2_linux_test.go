//go:build linux

package wsread

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestAttackStaleWorkEventFdReused: one worker, whose busy turn put O's
// event in work and then blocked in X's handler. O is closed meanwhile,
// and a new connection N takes O's fd number (and a new generation);
// N's message comes. Once X's handler returns, the worker handles O's
// stale event from work: claim must drop it (generation), and N must
// get its message once, and O none, and O end once.
func TestAttackStaleWorkEventFdReused(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for round := range 5 {
		ok := t.Run(fmt.Sprint(round), func(t *testing.T) {
			setup, held, rel := holdOn(1)
			ts, gl := startGated(t, Config{Mode: ModeEpoll, Workers: 1}, setup)
			t.Cleanup(rel)
			addr := strings.TrimPrefix(ts.url, "ws://")
			gl.gate <- struct{}{}
			x := dialRaw(t, ts.url, nil)
			xr := ts.next(t)
			gl.gate <- struct{}{}
			o := dialRaw(t, ts.url, nil)
			or := ts.next(t)
			registered(t, xr)
			registered(t, or)
			waitFor(t, "the watch resting", ts.s.p.watchIdle.Load)
			x.write(t, masked(opText, true, "hold"))
			o.write(t, masked(opText, true, "o1"))
			select {
			case <-held:
			case <-time.After(20 * time.Second):
				t.Fatal("X's handler not entered")
			}
			if len(ts.s.p.work) != 1 || len(or.messages()) != 0 {
				t.Skipf("O's event not left in work (work %d, O read %d)", len(ts.s.p.work), len(or.messages()))
			}
			nb, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			or.c.WS().Close()
			wantErr(t, or.waitClosed(t), net.ErrClosed)
			gl.gate <- struct{}{}
			n := upgradeRaw(t, nb, addr, nil)
			nr := ts.next(t)
			registered(t, nr)
			if nr.c.fd != or.c.fd {
				t.Skipf("N got fd %d, O had %d", nr.c.fd, or.c.fd)
			}
			n.write(t, masked(opText, true, "n1"))
			rel()
			waitFor(t, "N's message", func() bool { return len(nr.messages()) >= 1 })
			n.write(t, masked(opText, true, "n2"))
			waitFor(t, "N's second message", func() bool { return len(nr.messages()) >= 2 })
			if got := nr.messages(); !slices.Equal(got, []string{"n1", "n2"}) {
				t.Fatalf("N got %q", got)
			}
			if got := or.messages(); len(got) != 0 {
				t.Fatalf("O got %q after it was closed", got)
			}
			if cl := or.closes(); len(cl) != 1 {
				t.Fatalf("O Closed %d times: %v", len(cl), cl)
			}
			if cl := nr.closes(); len(cl) != 0 {
				t.Fatalf("N Closed(%v)", cl)
			}
			_ = x
		})
		if !ok {
			return
		}
	}
}

// TestAttackRunEndWithWorkQueued: Run ends while work holds a busy
// turn's events behind a blocked handler (one worker). Once the handler
// returns, Run must return; every connection must end exactly once,
// with net.ErrClosed, each message read at most once; and no goroutine
// of the poller must be left.
func TestAttackRunEndWithWorkQueued(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprint(workers, " workers"), func(t *testing.T) {
			setup, held, rel := holdOn(10)
			ts, stop := runServer(t, Config{Mode: ModeEpoll, Workers: workers}, setup)
			t.Cleanup(rel)
			const n = 40
			clients, recs := dialMany(t, ts, n)
			for _, r := range recs {
				registered(t, r)
			}
			waitFor(t, "the watch resting", ts.s.p.watchIdle.Load)
			for i, c := range clients {
				msg := "m"
				if i < workers {
					msg = "hold"
				}
				c.write(t, masked(opText, true, msg))
			}
			for range workers {
				select {
				case <-held:
				case <-time.After(20 * time.Second):
					t.Fatal("handler not entered")
				}
			}
			t.Logf("work holds %d events", len(ts.s.p.work))
			done := make(chan struct{})
			go func() { stop(); close(done) }()
			// Run is ending: the set is closed.
			waitFor(t, "stop", ts.s.p.stopping)
			rel()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("Run did not return\n%s", pollerStacks())
			}
			for i, r := range recs {
				cl := r.closes()
				if len(cl) != 1 {
					t.Fatalf("connection %d Closed %d times: %v", i, len(cl), cl)
				}
				if m := r.messages(); len(m) > 1 {
					t.Fatalf("connection %d got %q", i, m)
				}
			}
			if !holdsWithin(5*time.Second, func() bool { return len(pollerStacks()) == 0 }) {
				t.Fatalf("poller goroutines left after Run returned:\n%s", pollerStacks())
			}
		})
	}
}

// cpuTime is the process's user and system time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestAttackNoSpinBehindBlockedHandlers: every worker but one blocked in
// a handler, some in a kept turn (the watch ended it) and some from a
// busy one, with events left in work and more connections streaming
// now and then. Between bursts, once every message is read, the process
// must be idle: no worker taking and returning the turn in a loop.
func TestAttackNoSpinBehindBlockedHandlers(t *testing.T) {
	const workers = 4
	ts := holdServer(t, workers)
	const n = 60
	clients, recs := dialMany(t, ts, n)
	for _, r := range recs {
		registered(t, r)
	}
	// Blocked handlers: one in a kept turn (quiet set), then two from a
	// burst.
	waitFor(t, "the watch resting", ts.s.p.watchIdle.Load)
	clients[0].write(t, masked(opText, true, "hold"))
	waitFor(t, "the first blocked handler", func() bool { return len(recs[0].messages()) == 1 })
	for i := 1; i < 3; i++ {
		clients[i].write(t, masked(opText, true, "hold"))
	}
	for i := 3; i < n; i++ {
		clients[i].write(t, masked(opText, true, "m"))
	}
	for i := range n {
		waitFor(t, "every message", func() bool { return len(recs[i].messages()) == 1 })
	}
	for round := range 3 {
		// Quiet now: measure.
		waitFor(t, "the watch resting", ts.s.p.watchIdle.Load) // it ticks while a turn is kept
		before, start := cpuTime(), time.Now()
		time.Sleep(500 * time.Millisecond) // a span of real time to measure CPU over
		used, span := cpuTime()-before, time.Since(start)
		t.Logf("round %d: %v CPU in %v; work %d; turns the watch ended %d", round, used, span, len(ts.s.p.work), ts.s.p.taken.Load())
		if used > span/4 {
			t.Fatalf("round %d: %v CPU in %v while idle behind blocked handlers\n%s", round, used, span, pollerStacks())
		}
		for i := 3; i < n; i++ {
			clients[i].write(t, masked(opText, true, "m"))
		}
		for i := 3; i < n; i++ {
			waitFor(t, "every message", func() bool { return len(recs[i].messages()) == round+2 })
		}
	}
}

// TestAttackChurnOrderedOnce: workers on more Ps than CPUs, connections
// that stream numbered messages in random cuts, handlers now and then
// slower than the watch, and connections closed by the server mid-stream
// and replaced by new ones (fd numbers reused while their old events may
// sit in work). Every connection's messages must come once each, in
// order, all of them unless it was closed, and Closed exactly once.
func TestAttackChurnOrderedOnce(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	for _, workers := range []int{1, 3} {
		t.Run(fmt.Sprint(workers, " workers"), func(t *testing.T) {
			ts, stop := runServer(t, Config{Mode: ModeEpoll, Workers: workers, ReadLimit: 4096}, func(r *recorder) {
				r.onMessage = func(_ *recorder, _ int, data []byte) bool {
					if data[0] == 's' {
						time.Sleep(3 * watchEvery) // past the watch: real time
					}
					return true
				}
			})
			const conns, each = 40, 150
			type peer struct {
				c      *rawClient
				r      *recorder
				closed atomic.Bool
			}
			var mu sync.Mutex
			var all []*peer
			var wg sync.WaitGroup
			var dialMu sync.Mutex
			dial := func() *peer {
				dialMu.Lock()
				defer dialMu.Unlock()
				p := &peer{c: dialRaw(t, ts.url, nil)}
				p.r = ts.next(t)
				mu.Lock()
				all = append(all, p)
				mu.Unlock()
				return p
			}
			stream := func(p *peer, seed uint64) {
				rng := rand.New(rand.NewPCG(seed, 1))
				var buf bytes.Buffer
				for j := range each {
					kind := "q"
					if rng.IntN(40) == 0 {
						kind = "s"
					}
					buf.Write(masked(opText, true, fmt.Sprintf("%s%d", kind, j)))
				}
				b := buf.Bytes()
				for len(b) > 0 {
					k := min(len(b), 1+rng.IntN(200))
					if _, err := p.c.nc.Write(b[:k]); err != nil {
						return
					}
					b = b[k:]
					if rng.IntN(8) == 0 {
						runtime.Gosched()
					}
				}
			}
			for i := range conns {
				p := dial()
				wg.Go(func() { stream(p, uint64(i)) })
			}
			// Close some mid-stream and replace them.
			for i := range 15 {
				mu.Lock()
				p := all[rand.IntN(len(all))]
				mu.Unlock()
				if p.closed.Swap(true) {
					continue
				}
				p.r.c.WS().Close()
				q := dial()
				wg.Go(func() { stream(q, uint64(1000+i)) })
			}
			wg.Wait()
			mu.Lock()
			peers := slices.Clone(all)
			mu.Unlock()
			for i, p := range peers {
				if p.closed.Load() {
					waitFor(t, "Closed", func() bool { return len(p.r.closes()) > 0 })
				} else if !holdsWithin(20*time.Second, func() bool { return len(p.r.messages()) == each }) {
					t.Fatalf("connection %d: %d of %d messages\n%s", i, len(p.r.messages()), each, pollerStacks())
				}
				for j, m := range p.r.messages() {
					if m[1:] != fmt.Sprint(j) {
						t.Fatalf("connection %d (closed %v): message %d is %q", i, p.closed.Load(), j, m)
					}
				}
			}
			stop()
			for i, p := range peers {
				if cl := p.r.closes(); len(cl) != 1 {
					t.Fatalf("connection %d Closed %d times: %v", i, len(cl), cl)
				}
			}
		})
	}
}
