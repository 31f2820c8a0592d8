package main

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

type firing struct {
	c  *conn
	at time.Duration // since the test's start
}

// recorder is a fire function that notes each firing and has the
// connection fired again every interval, or drops it when told.
type recorder struct {
	mu     sync.Mutex
	start  time.Time
	every  time.Duration
	fired  []firing
	dropAt map[*conn]int // drop on this firing (from 1)
	count  map[*conn]int
	slow   map[*conn]time.Duration // each firing takes this long, as a slow write
}

func newRecorder(every time.Duration) *recorder {
	return &recorder{start: time.Now(), every: every, dropAt: map[*conn]int{}, count: map[*conn]int{}, slow: map[*conn]time.Duration{}}
}

// fire reschedules as a connection does (nextDue).
func (r *recorder) fire(c *conn, due, now time.Time) (time.Time, bool) {
	r.mu.Lock()
	r.fired = append(r.fired, firing{c, now.Sub(r.start)})
	r.count[c]++
	drop, slow := r.dropAt[c] == r.count[c], r.slow[c]
	r.mu.Unlock()
	time.Sleep(slow) // in a synctest bubble: the fake clock moves, no real time passes
	if drop {
		return time.Time{}, false
	}
	return nextDue(due, now, r.every), true
}

func (r *recorder) take() []firing {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.fired
	r.fired = nil
	return f
}

func startPinger(t *testing.T, r *recorder) *pinger {
	p := newPinger()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.run(ctx, r.fire) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return p
}

// checkFirings fails t unless got are the firings want, in order.
func checkFirings(t *testing.T, got, want []firing) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("fired %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("firing %d: %p at %v, want %p at %v", i, got[i].c, got[i].at, want[i].c, want[i].at)
		}
	}
}

func TestPingerFiresWhenDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(15 * time.Second)
		p := startPinger(t, r)
		a, b, c := &conn{}, &conn{}, &conn{}
		p.add(a, r.start.Add(5*time.Second))
		p.add(b, r.start.Add(2*time.Second))
		p.add(c, r.start.Add(9*time.Second))
		time.Sleep(31 * time.Second)
		synctest.Wait()
		want := []firing{{b, 2 * time.Second}, {a, 5 * time.Second}, {c, 9 * time.Second},
			{b, 17 * time.Second}, {a, 20 * time.Second}, {c, 24 * time.Second}} // b's third is at 32 s
		checkFirings(t, r.take(), want)
	})
}

func TestNextDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const every = 15 * time.Second
	for _, tc := range []struct {
		name     string
		late     time.Duration // now - due
		wantFrom time.Duration // next - due
	}{
		{"on time", 0, every},
		{"a timer tick late", 1100 * time.Microsecond, every},
		{"late by almost a period", every - time.Millisecond, every},
		{"late by a period: that ping is skipped", every, 2 * every},
		{"late by two and a half: two skipped", 5 * every / 2, 3 * every},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextDue(t0, t0.Add(tc.late), every).Sub(t0); got != tc.wantFrom {
				t.Errorf("next %v after due, want %v", got, tc.wantFrom)
			}
		})
	}
}

// Two connections fired together, because the pinger was held up by a
// slow write, keep their own phases: the next cycle fires them apart, as
// independent clients would ping, not in one burst (counted from the
// firing, both would be due at 11.5 s).
func TestPingerKeepsEachConnectionsPhase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(10 * time.Second)
		p := startPinger(t, r)
		slow, a, b := &conn{}, &conn{}, &conn{}
		r.slow[slow] = 500 * time.Millisecond
		r.dropAt[slow] = 1
		p.add(slow, r.start.Add(time.Second))
		p.add(a, r.start.Add(1100*time.Millisecond))
		p.add(b, r.start.Add(1200*time.Millisecond))
		time.Sleep(12 * time.Second) // the bubble's fake clock
		synctest.Wait()
		want := []firing{{slow, time.Second}, {a, 1500 * time.Millisecond}, {b, 1500 * time.Millisecond},
			{a, 11100 * time.Millisecond}, {b, 11200 * time.Millisecond}}
		checkFirings(t, r.take(), want)
	})
}

func TestPingerWakesForAnEarlierEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(time.Hour)
		p := startPinger(t, r)
		late, early := &conn{}, &conn{}
		p.add(late, r.start.Add(time.Minute))
		synctest.Wait() // the pinger sleeps until the minute
		time.Sleep(time.Second)
		p.add(early, r.start.Add(3*time.Second))
		time.Sleep(2*time.Second + time.Millisecond)
		synctest.Wait()
		if got := r.take(); len(got) != 1 || got[0] != (firing{early, 3 * time.Second}) {
			t.Fatalf("fired %v, want only the early one at 3s", got)
		}
	})
}

func TestPingerDropsAndRetimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(10 * time.Second)
		p := startPinger(t, r)
		keep, drop := &conn{}, &conn{}
		r.dropAt[drop] = 1
		p.add(keep, r.start.Add(time.Second))
		p.add(drop, r.start.Add(time.Second))
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := p.len(); n != 1 {
			t.Fatalf("%d connections waiting after one was dropped, want 1", n)
		}
		r.take()
		// As the leaving does: every connection due again at once.
		p.retime(func(*conn) time.Time { return time.Now() })
		synctest.Wait()
		if got := r.take(); len(got) != 1 || got[0] != (firing{keep, 2 * time.Second}) {
			t.Fatalf("after retime fired %v, want the kept one at 2s", got)
		}
	})
}

func TestPingerHasNoGoroutinePerConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(15 * time.Second)
		p := startPinger(t, r)
		synctest.Wait()
		before := runtime.NumGoroutine()
		const n = 1000
		for i := range n {
			p.add(&conn{}, r.start.Add(time.Duration(i)*15*time.Second/n))
		}
		time.Sleep(time.Minute - time.Millisecond) // 4 pings each, the first at 0
		synctest.Wait()
		// The count is the whole process's: goroutines outside this
		// bubble (another test's, ending) may come and go meanwhile. One
		// per connection would be a thousand.
		if after := runtime.NumGoroutine(); after > before+10 {
			t.Errorf("%d goroutines with %d connections held, %d with none", after, n, before)
		}
		if got := len(r.take()); got != 4*n {
			t.Errorf("%d pings in a minute from %d connections at 15 s, want %d", got, n, 4*n)
		}
	})
}
