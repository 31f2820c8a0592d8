package gateway

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// dropped remembers the last grant of connections that ended without a
// normal close, until the grant runs out: their sessions are left to run
// out in Redis, and if Redis loses them meanwhile (a restart without its
// data), a resync writes them back, so that those users still get their
// guide. One entry per user, the latest; a user who reconnects is
// restored from the live connection too, and resync keeps the later
// deadline.
//
// A resync has no use for a grant that ran out before the outage it
// follows began (it would restore nothing), so each is forgotten when it
// runs out (a linger later: an outage is seen up to a heartbeat's timeout
// after it began), or, while Redis is or was out of reach and no resync
// has followed yet, when it ran out before that began: one that ran out
// in the outage is handed over as lapsed. The sweep loop pops them off a
// heap ordered by their end, which costs a look at the heap's top on a
// quiet gateway, and log n per grant forgotten. The map then holds the
// users whose connection dropped within one TTL (or since the outage
// began), and at most max of them: past that, the grant that runs out
// first goes first.
type dropped struct {
	start  time.Time // the gateway's: grants are timed since then
	max    int
	linger time.Duration

	mu     sync.Mutex
	grants map[string]*droppedGrant // by uid
	byEnd  droppedHeap              // the same grants, the first to run out on top
}

type droppedGrant struct {
	uid     string
	segment string
	pingAt  time.Duration // since the gateway started
	ttl     time.Duration
	i       int // index in byEnd
}

// end is when g runs out, since the gateway started.
func (g *droppedGrant) end() time.Duration { return g.pingAt + g.ttl }

// droppedSweepEvery is how often grants that ran out are forgotten: they
// stay up to this long after their end, for a resync to skip.
const droppedSweepEvery = time.Second

func newDropped(start time.Time, max int, linger time.Duration) *dropped {
	return &dropped{start: start, max: max, linger: linger, grants: map[string]*droppedGrant{}}
}

// add remembers c's last grant, if it has one.
func (d *dropped) add(c *conn) {
	ttl := time.Duration(c.grant.Load())
	if ttl == 0 {
		return // never pinged, or ended by a normal close
	}
	g := &droppedGrant{uid: c.uid, segment: c.segment, pingAt: time.Duration(c.pingAt.Load()), ttl: ttl.Abs()}
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.grants[c.uid]; ok {
		if old.end() < g.end() {
			old.segment, old.pingAt, old.ttl = g.segment, g.pingAt, g.ttl
			heap.Fix(&d.byEnd, old.i)
		}
		return
	}
	if len(d.grants) >= d.max {
		if d.byEnd[0].end() >= g.end() {
			metricDroppedEvicted.Inc()
			return // it would run out first itself
		}
		delete(d.grants, heap.Pop(&d.byEnd).(*droppedGrant).uid)
		metricDroppedEvicted.Inc()
	}
	d.grants[c.uid] = g
	heap.Push(&d.byEnd, g)
	metricDroppedGrants.Set(float64(len(d.grants)))
}

// forget drops the grants that ran out before until (since the gateway
// started). d.mu is held.
func (d *dropped) forget(until time.Duration) {
	for len(d.byEnd) > 0 && d.byEnd[0].end() < until {
		delete(d.grants, heap.Pop(&d.byEnd).(*droppedGrant).uid)
	}
	if n := len(d.byEnd); cap(d.byEnd) > droppedCompactFrom && n < cap(d.byEnd)/4 {
		// Neither a map nor a slice gives back its room as it empties:
		// after a wave of drops (a network partition of many clients),
		// they are rebuilt at their size.
		d.byEnd = append(make(droppedHeap, 0, 2*n), d.byEnd...)
		d.grants = make(map[string]*droppedGrant, 2*n)
		for _, g := range d.byEnd {
			d.grants[g.uid] = g
		}
	}
	metricDroppedGrants.Set(float64(len(d.grants)))
}

// droppedCompactFrom is the room below which the grants are never
// rebuilt: a few KB.
const droppedCompactFrom = 1024

// sweep forgets the grants that ran out, every droppedSweepEvery, until
// ctx is done; while outage reports the start of an outage that no resync
// has followed yet, it keeps those that ran out since.
func (d *dropped) sweep(ctx context.Context, outage func() time.Time) {
	t := time.NewTicker(droppedSweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		until := time.Since(d.start) - d.linger
		if from := outage(); !from.IsZero() {
			until = min(until, from.Sub(d.start))
		}
		d.mu.Lock()
		d.forget(until)
		d.mu.Unlock()
	}
}

// left returns the grants that run out at or after from, with what is left
// of them at now (none, for one that ran out: see session.Grant), and
// forgets those that ran out before from (times since the gateway
// started).
func (d *dropped) left(now, from time.Duration) []session.Grant {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.forget(from)
	out := make([]session.Grant, 0, len(d.grants))
	for uid, g := range d.grants {
		out = append(out, session.Grant{UID: uid, Segment: g.segment, Left: g.end() - now, Ago: now - g.pingAt})
	}
	return out
}

// droppedHeap orders grants by their end, for container/heap.
type droppedHeap []*droppedGrant

func (h droppedHeap) Len() int           { return len(h) }
func (h droppedHeap) Less(i, j int) bool { return h[i].end() < h[j].end() }
func (h droppedHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i, h[j].i = i, j
}
func (h *droppedHeap) Push(x any) {
	g := x.(*droppedGrant)
	g.i = len(*h)
	*h = append(*h, g)
}
func (h *droppedHeap) Pop() any {
	old := *h
	g := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return g
}
