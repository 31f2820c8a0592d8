package gateway

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/token"
)

// A connection lives as long as its token. When the token expires, the
// gateway closes the connection with frame.CloseTokenExpired (4001),
// unless the client has sent a fresh token for the same user and segment
// in an auth frame first: a browser refreshes its token without
// reconnecting. No renewal is written for a ping that arrives after the
// token expired. "Expired" allows the verifier's leeway for clock skew
// (token.Leeway, 5s) after the token's exp, as the upgrade did.
//
// The expiries of every connection's token share one timer: a min-heap
// by the token's end, on one goroutine (expiries.run), instead of a
// runtime timer per connection. A connection is in it from armExpiry
// until its token expires or it ends (stopExpiry); a refresh moves its
// place (refresh). The heap's lock is taken after a connection's mu,
// never before, and the timer calls a connection outside it.

// armExpiry puts c's token end on the gateway's timer, unless c has
// ended: stop sets flagClosed before it takes c off, so a late arming
// cannot put back a connection that ended.
func (c *conn) armExpiry() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.is(flagClosed) {
		return
	}
	c.g.expiries.add(c)
}

// tokenEnd is when the connection's token ends, leeway included.
func (c *conn) tokenEnd() time.Time {
	return time.Unix(int64(c.expiresSec.Load()), 0).Add(token.Leeway)
}

// stopExpiry takes c off the timer; stop calls it once flagClosed is set.
func (c *conn) stopExpiry() { c.g.expiries.remove(c) }

// expiryDue runs on the timer's goroutine when c's token end has come:
// a token refreshed meanwhile moves it on, else the connection ends. It
// must not block: every connection's expiry waits behind it.
func (c *conn) expiryDue() {
	if time.Until(c.tokenEnd()) > 0 {
		c.armExpiry()
		return
	}
	c.expire()
}

// tokenSec is a token's expiry as a connection keeps it: Unix seconds,
// rounded up (a token's exp is whole seconds), within uint32.
func tokenSec(exp time.Time) uint32 {
	sec := exp.Unix()
	if exp.Nanosecond() > 0 {
		sec++
	}
	return uint32(min(max(sec, 0), math.MaxUint32))
}

// tokenExpired reports whether the connection's token has expired.
func (c *conn) tokenExpired() bool { return !time.Now().Before(c.tokenEnd()) }

// expire closes the connection for its expired token, once. The reader
// ends on the client's close frame, on any other frame (Message checks
// revoked), or at the linger deadline set here, whichever is first.
func (c *conn) expire() {
	if !c.set(flagRevoked) {
		return
	}
	metricTokens.WithLabelValues("expired").Inc()
	c.g.log.Debug("token expired, closing", "uid", c.uid)
	c.closeWith(frame.CloseTokenExpired, "token expired")
	c.ws.NetConn().SetReadDeadline(time.Now().Add(lingerTimeout))
}

// refresh takes the token of an auth frame. It must verify and name the
// connection's user and segment (a client changes segments by
// reconnecting). The connection then lasts until the later of the two
// tokens' expiries. A refused token changes nothing: the client is told,
// and the connection keeps the token it had.
func (c *conn) refresh(raw string) {
	claims, err := c.g.verifier.Verify(raw)
	switch {
	case err != nil:
	case claims.UID != c.uid:
		err = errors.New("token is for another user")
	case claims.Segment != c.segment:
		err = errors.New("token is for another segment; reconnect to change segments")
	}
	if err != nil {
		metricTokens.WithLabelValues("refused").Inc()
		c.enqueue(frame.Error(frame.CodeBadToken, err.Error()))
		return
	}
	exp := c.g.expiries.extend(c, tokenSec(claims.Expires)) * 1000
	metricTokens.WithLabelValues("refreshed").Inc()
	c.enqueue(frame.AuthOK(exp))
}

// expiries is the gateway's one timer of token expiries (see above).
type expiries struct {
	mu sync.Mutex
	// heap holds the connections on the timer, the earliest token end
	// first; a connection's expiryAt is 1 + its index, 0 when not in it.
	// A connection's expiresSec changes only under mu while it is in it.
	heap []*conn
	wake chan struct{} // the earliest end came earlier; capacity 1
}

func newExpiries() *expiries { return &expiries{wake: make(chan struct{}, 1)} }

// add puts c on the timer.
func (e *expiries) add(c *conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.expiryAt != 0 {
		return
	}
	e.heap = append(e.heap, c)
	c.expiryAt = int32(len(e.heap))
	e.up(len(e.heap) - 1)
	if e.heap[0] == c {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// remove takes c off the timer, if it is on it.
func (e *expiries) remove(c *conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.expiryAt != 0 {
		e.removeAt(int(c.expiryAt) - 1)
	}
}

// extend moves c's token end to exp (Unix seconds), if later, and returns
// the end it has now.
func (e *expiries) extend(c *conn, exp uint32) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := c.expiresSec.Load()
	if exp <= old {
		return int64(old)
	}
	c.expiresSec.Store(exp)
	if c.expiryAt != 0 {
		e.down(int(c.expiryAt) - 1) // later: it sinks, if anywhere
	}
	return int64(exp)
}

// run calls expiryDue of each connection whose token end has come, until
// ctx is done.
func (e *expiries) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []*conn
	for {
		now := time.Now()
		wait := time.Hour
		e.mu.Lock()
		for len(e.heap) > 0 {
			if left := e.heap[0].tokenEnd().Sub(now); left > 0 {
				wait = left
				break
			}
			due = append(due, e.heap[0])
			e.removeAt(0)
		}
		e.mu.Unlock()
		for i, c := range due {
			c.expiryDue()
			due[i] = nil
		}
		due = due[:0]
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-e.wake:
		}
	}
}

// removeAt takes the connection at i off the heap. e.mu is held.
func (e *expiries) removeAt(i int) {
	last := len(e.heap) - 1
	c := e.heap[i]
	e.swap(i, last)
	e.heap[last] = nil
	e.heap = e.heap[:last]
	c.expiryAt = 0
	if i < last {
		e.down(i)
		e.up(i)
	}
}

func (e *expiries) less(i, j int) bool {
	return e.heap[i].expiresSec.Load() < e.heap[j].expiresSec.Load()
}

func (e *expiries) swap(i, j int) {
	e.heap[i], e.heap[j] = e.heap[j], e.heap[i]
	e.heap[i].expiryAt = int32(i + 1)
	e.heap[j].expiryAt = int32(j + 1)
}

func (e *expiries) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !e.less(i, p) {
			return
		}
		e.swap(i, p)
		i = p
	}
}

func (e *expiries) down(i int) {
	n := len(e.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && e.less(r, l) {
			m = r
		}
		if !e.less(m, i) {
			return
		}
		e.swap(i, m)
		i = m
	}
}
