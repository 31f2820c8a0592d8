package main

import (
	"bytes"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/loadtest/latency"
)

// load is what every connection of the process shares: its counters, the
// ping→pong histogram and whether it is leaving.
type load struct {
	start time.Time // the clock of conn.sent
	every time.Duration

	connected, failed, dropped, closed, pings, pongs, guides atomic.Int64

	// pongs is the histogram of ping→pong times since the start, or the
	// last mark (SIGUSR1): swapped whole, so a mark needs no lock.
	latency atomic.Pointer[latency.Histogram]
	// leaving: the hold is over; a connection's next firing is its close,
	// and a read error after it is no longer the gateway's doing.
	leaving atomic.Bool

	mu       sync.Mutex
	guideIDs map[string]struct{}
	live     sync.WaitGroup // connections not yet Closed
}

func newLoad(every time.Duration) *load {
	l := &load{start: time.Now(), every: every, guideIDs: map[string]struct{}{}}
	l.latency.Store(&latency.Histogram{})
	return l
}

// mark starts the ping→pong histogram afresh and returns the one it ends.
func (l *load) mark() *latency.Histogram {
	return l.latency.Swap(&latency.Histogram{})
}

func (l *load) guide(id string) {
	l.guides.Add(1)
	l.mu.Lock()
	l.guideIDs[id] = struct{}{}
	l.mu.Unlock()
}

func (l *load) distinctGuides() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.guideIDs)
}

// conn is one held connection. Its reader (the read adapter, through
// Message and Closed) and its pinger (through fire) share it: sent and
// the flags are atomics for that.
type conn struct {
	l  *load
	ws *websocket.Conn
	// sent is when the ping not yet answered went out, in ns since
	// l.start; 0 when none is outstanding. A pong answers the one ping
	// out, as the gateway answers in order and we send the next only an
	// interval later.
	sent atomic.Int64
	// ours: we closed it (a failed write, or the leaving), so the end of
	// its reads is not the gateway's doing.
	ours atomic.Bool
	gone atomic.Bool // Closed ran
}

var pingFrame = []byte(`{"type":"ping"}`)

// The gateway writes a pong as a struct whose first field is its type:
// the common frame is told apart without decoding it.
var pongPrefix = []byte(`{"type":"pong"`)

// Message takes one frame from the gateway. It does not block: the read
// adapter may run it on a goroutine shared by many connections.
func (c *conn) Message(_ int, data []byte) bool {
	l := c.l
	if bytes.HasPrefix(data, pongPrefix) {
		c.pong()
		return true
	}
	var f struct{ Type, ID string }
	if json.Unmarshal(data, &f) != nil {
		return true
	}
	switch f.Type {
	case "pong":
		c.pong()
	case "guide":
		l.guide(f.ID)
	}
	return true
}

func (c *conn) pong() {
	c.l.pongs.Add(1)
	if s := c.sent.Swap(0); s != 0 {
		c.l.latency.Load().Record(time.Duration(time.Since(c.l.start).Nanoseconds() - s))
	}
}

// Closed runs once, when the connection's reads end.
func (c *conn) Closed(error) {
	if !c.ours.Load() && !c.l.leaving.Load() {
		c.l.closed.Add(1)
	}
	c.gone.Store(true)
	c.l.live.Done()
}

// writeTimeout bounds a ping or close write. A loopback socket takes a
// 15-byte frame at once; one that does not for this long has a gateway
// that stopped reading, and its pinger's other connections wait behind it.
const writeTimeout = 10 * time.Second

// fire is the pinger's turn at c, due at due: a ping, or while leaving a
// normal close.
func (c *conn) fire(due, now time.Time) (time.Time, bool) {
	l := c.l
	if c.gone.Load() {
		return time.Time{}, false
	}
	if l.leaving.Load() {
		// The gateway sees a normal close and answers it; the read
		// adapter then reports Closed.
		c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), now.Add(time.Second))
		return time.Time{}, false
	}
	c.sent.Store(max(now.Sub(l.start).Nanoseconds(), 1))
	c.ws.SetWriteDeadline(now.Add(writeTimeout))
	if err := c.ws.WriteMessage(websocket.TextMessage, pingFrame); err != nil {
		l.dropped.Add(1)
		c.ours.Store(true)
		c.ws.Close()
		return time.Time{}, false
	}
	l.pings.Add(1)
	return nextDue(due, now, l.every), true
}
