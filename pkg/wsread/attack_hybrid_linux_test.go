//go:build linux

package wsread

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAttackBatchBehindBlockedHandler: two workers; the turn's worker
// parked on a quiet set wakes with two connections ready, the first of
// which blocks in its handler. A busy turn hands the token on first (the
// other worker, idle in its select, takes it and goes to wait on the now
// empty set) and only then puts the second event in p.work, which no
// worker reads: one is in the blocked handler, the other waits in the
// netpoller for an event that does not come. The second connection's
// message waits for the blocked handler, however long; the watch does
// not help, as the turn was handed on. The old design handed the turn on
// and left the second event in the set, where the other worker took it.
func TestAttackBatchBehindBlockedHandler(t *testing.T) {
	// One P: the worker woken by the first write runs only once the test
	// goroutine blocks, so both messages are in the set by then, as they
	// are whenever two land while a worker wakes.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ts := holdServer(t, 2)
	s := dialRaw(t, ts.url, nil)
	sr := ts.next(t)
	f := dialRaw(t, ts.url, nil)
	fr := ts.next(t)
	for _, r := range []*recorder{sr, fr} {
		registered(t, r)
	}
	waitFor(t, "the watch resting", ts.s.p.watchIdle.Load)
	s.write(t, masked(opText, true, "hold"))
	f.write(t, masked(opText, true, "f"))
	waitFor(t, "the blocked handler", func() bool { return len(sr.messages()) == 1 })
	// The bound is far above the watch's 10 ms, for a busy machine: the
	// message waits for as long as the handler blocks (here, the test).
	if !holdsWithin(2*time.Second, func() bool { return len(fr.messages()) == 1 }) {
		t.Fatalf("a message ready with a blocked one not read within 2s, with a worker idle (turns the watch ended: %d)",
			ts.s.p.taken.Load())
	}
}

// TestAttackBatchBehindBlockedHandlerGate: as above on every P: the
// turn's worker is kept in a quiet handle (a gate, opened within the
// watch's reach) while the two messages arrive, so that its next wait
// takes both at once without waiting.
func TestAttackBatchBehindBlockedHandlerGate(t *testing.T) {
	failed := 0
	const rounds = 5
	for i := range rounds {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			release := make(chan struct{})
			entered := make(chan struct{}, 1)
			gate := make(chan struct{})
			ts := startServer(t, Config{Mode: ModeEpoll, Workers: 2}, func(r *recorder) {
				r.onMessage = func(_ *recorder, _ int, data []byte) bool {
					switch string(data) {
					case "hold":
						<-release
					case "gate":
						entered <- struct{}{}
						select {
						case <-gate:
						case <-time.After(20 * time.Second):
						}
					}
					return true
				}
			})
			t.Cleanup(func() { close(release) })
			g := dialRaw(t, ts.url, nil)
			gr := ts.next(t)
			s := dialRaw(t, ts.url, nil)
			sr := ts.next(t)
			f := dialRaw(t, ts.url, nil)
			fr := ts.next(t)
			for _, r := range []*recorder{gr, sr, fr} {
				registered(t, r)
			}
			waitFor(t, "the watch resting", ts.s.p.watchIdle.Load)
			g.write(t, masked(opText, true, "gate"))
			select {
			case <-entered:
			case <-time.After(20 * time.Second):
				t.Fatal("gate handler not entered")
			}
			taken := ts.s.p.taken.Load()
			s.write(t, masked(opText, true, "hold"))
			f.write(t, masked(opText, true, "f"))
			close(gate)
			waitFor(t, "the blocked handler", func() bool { return len(sr.messages()) == 1 })
			if !holdsWithin(2*time.Second, func() bool { return len(fr.messages()) == 1 }) {
				failed++
				t.Logf("a message ready with a blocked one not read within 2s, with a worker idle (turns the watch ended: %d, before the writes %d)",
					ts.s.p.taken.Load(), taken)
			}
		})
	}
	// A round whose gate outlived the watch's reach passes either way.
	if failed > 0 {
		t.Errorf("%d of %d rounds: a message stranded behind a blocked handler", failed, rounds)
	}
}

// TestAttackTwoBatchesFillWork: two workers, many connections streaming,
// so that every wait takes a full batch (128). A busy turn hands the
// token on and then puts 127 events in p.work (capacity 128); the next
// worker, if it takes the token before they are all in, takes another
// 128 and puts its 127 in too. Both block on the full channel, and no
// worker is left to read it: every connection stops until Run ends.
func TestAttackTwoBatchesFillWork(t *testing.T) {
	for i := range 3 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			ts := startServer(t, Config{Mode: ModeEpoll, Workers: 2, ReadLimit: 1024}, nil)
			const conns = 400
			clients, recs := dialMany(t, ts, conns)
			const per = 40
			chunk := numbered(per)
			const rounds = 10
			var wg sync.WaitGroup
			for _, c := range clients {
				wg.Go(func() {
					for range rounds {
						if _, err := c.nc.Write(chunk); err != nil {
							return
						}
					}
				})
			}
			wg.Wait()
			for j, r := range recs {
				if !holdsWithin(20*time.Second, func() bool { return len(r.messages()) == rounds*per }) {
					t.Fatalf("connection %d: %d of %d messages read\n%s", j, len(r.messages()), rounds*per, pollerStacks())
				}
				for k, m := range r.messages() {
					if m != fmt.Sprintf("%04d", k%per) {
						t.Fatalf("connection %d: message %d is %q", j, k, m)
					}
				}
			}
		})
	}
}

// TestAttackBlockedHandlerStallsAll: two workers, a blocked handler, and
// a burst of more connections than one batch holds. The first turn takes
// 128 (the blocked one first), hands the token on and fills p.work; the
// other worker, woken with the token, takes the next 128 without waiting
// and blocks putting them in the full p.work, which only the blocked
// worker would read. No connection is read until the handler returns:
// one blocked handler stalls every connection with a worker to spare.
// The old design's other worker read them all meanwhile.
func TestAttackBlockedHandlerStallsAll(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ts := holdServer(t, 2)
	const n = 300
	clients, recs := dialMany(t, ts, n)
	for _, r := range recs {
		registered(t, r)
	}
	waitFor(t, "the watch resting", ts.s.p.watchIdle.Load)
	for i, c := range clients {
		msg := "m"
		if i == 0 {
			msg = "hold"
		}
		c.write(t, masked(opText, true, msg))
	}
	read := func() int {
		k := 0
		for _, r := range recs[1:] {
			k += len(r.messages())
		}
		return k
	}
	if !holdsWithin(5*time.Second, func() bool { return read() == n-1 }) {
		t.Fatalf("%d of %d messages read in 5s while one handler blocks, with two workers", read(), n-1)
	}
}

// TestAttackChurnFillsWork: two workers on every P, and more connections
// than two batches, each with far more queued than a turn reads (the
// read limit is small), so that every wait takes a full batch for as long
// as the test lasts. Two turns that overlap both put 127 events in p.work
// (capacity 128) and both block there: no worker is left to read it. It
// caught that once in 13 rounds; now that only the turn puts events in
// work, and no more than it has room for, it cannot happen, and a few
// rounds watch that it stays so.
func TestAttackChurnFillsWork(t *testing.T) {
	// More Ps than CPUs, and goroutines that burn them: the kernel
	// deschedules a worker's thread anywhere, such as between handing the
	// token on and putting its batch in p.work, while another P runs the
	// next turn.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	var done atomic.Bool
	var burners sync.WaitGroup
	defer func() { done.Store(true); burners.Wait() }()
	for range 4 {
		burners.Go(func() {
			for spins := 0; !done.Load(); spins++ {
			}
		})
	}
	for i := range 3 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			ts := startServer(t, Config{Mode: ModeEpoll, Workers: 2, ReadLimit: 256}, nil)
			const conns = 400
			clients, recs := dialMany(t, ts, conns)
			const per = 800
			chunk := numbered(per)
			var wg sync.WaitGroup
			for _, c := range clients {
				wg.Go(func() { c.nc.Write(chunk) })
			}
			wg.Wait()
			for j, r := range recs {
				if !holdsWithin(20*time.Second, func() bool { return len(r.messages()) == per }) {
					t.Fatalf("connection %d: %d of %d messages read\n%s", j, len(r.messages()), per, pollerStacks())
				}
			}
		})
	}
}

// numbered is n text frames, as a client sends them, saying 0000, 0001
// and on.
func numbered(n int) []byte {
	var b bytes.Buffer
	for k := range n {
		b.Write(masked(opText, true, fmt.Sprintf("%04d", k)))
	}
	return b.Bytes()
}
