package main

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// pinger owns the timing of a share of the connections: it fires each
// one when due, from its one goroutine, so an idle connection has no
// goroutine of its own waiting for its next ping. A connection is in one
// pinger only, and that pinger is its one writer of data frames.
type pinger struct {
	mu   sync.Mutex
	q    dueQueue
	wake chan struct{} // an entry went to the head of q: its timer is stale
}

func newPinger() *pinger { return &pinger{wake: make(chan struct{}, 1)} }

// add has c fired at due.
func (p *pinger) add(c *conn, due time.Time) {
	p.mu.Lock()
	heap.Push(&p.q, entry{due: due, c: c})
	first := p.q[0].c == c
	p.mu.Unlock()
	if first {
		p.poke()
	}
}

// retime gives every connection waiting in p a new due time, as the
// leaving does to spread its closes.
func (p *pinger) retime(due func(*conn) time.Time) {
	p.mu.Lock()
	for i := range p.q {
		p.q[i].due = due(p.q[i].c)
	}
	heap.Init(&p.q)
	p.mu.Unlock()
	p.poke()
}

// len is the number of connections waiting.
func (p *pinger) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.q)
}

func (p *pinger) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run fires connections as they fall due until ctx ends. fire is given
// when c was due and when it fired, and returns when c is due next, or
// false to forget it (closed, or left). It runs outside p's lock, so
// adds are not held up by a slow write.
func (p *pinger) run(ctx context.Context, fire func(c *conn, due, now time.Time) (time.Time, bool)) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []entry
	var again []entry
	for {
		now := time.Now()
		p.mu.Lock()
		due = due[:0]
		for len(p.q) > 0 && !p.q[0].due.After(now) {
			due = append(due, heap.Pop(&p.q).(entry))
		}
		p.mu.Unlock()
		again = again[:0]
		for _, e := range due {
			if next, ok := fire(e.c, e.due, now); ok {
				again = append(again, entry{due: next, c: e.c})
			}
		}
		p.mu.Lock()
		for _, e := range again {
			heap.Push(&p.q, e)
		}
		wait := time.Hour
		if len(p.q) > 0 {
			wait = time.Until(p.q[0].due)
		}
		p.mu.Unlock()
		if wait <= 0 {
			continue
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-timer.C:
		}
	}
}

// nextDue is when a connection due at due, fired at now, pings next:
// every after due, keeping its own schedule, as a client's own timer
// does. Counted from now instead, a pinger that falls behind (a busy
// machine, a slow write) would push every later ping back, offering
// less load exactly while the system under test is slow, and the
// connections one late wake-up fired together would stay together.
// Pings missed by a whole period are skipped, not sent in a burst to
// catch up.
func nextDue(due, now time.Time, every time.Duration) time.Time {
	next := due.Add(every)
	if next.After(now) {
		return next
	}
	return now.Add(every - now.Sub(due)%every)
}

type entry struct {
	due time.Time
	c   *conn
}

// dueQueue is a min-heap of entries by due time (container/heap).
type dueQueue []entry

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q dueQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *dueQueue) Push(x any)        { *q = append(*q, x.(entry)) }
func (q *dueQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = entry{}
	*q = old[:len(old)-1]
	return e
}
