package devstack

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
)

// redialPause is how long a user waits after a failed connect.
const redialPause = 100 * time.Millisecond

// crowd runs simulated chat users against a faultRig until stopped.
type crowd struct {
	r      *faultRig
	period time.Duration
	quit   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup // users and their connections' readers
	users  []*chatUser
}

// newCrowd returns an empty crowd, stopped at cleanup at the latest.
func newCrowd(r *faultRig, period time.Duration) *crowd {
	c := &crowd{r: r, period: period, quit: make(chan struct{})}
	r.t.Cleanup(c.stop)
	return c
}

// add starts a user of group that pings every period within each window
// of plan, in order. After the last window it keeps its connection open
// if keep is set, and otherwise drops it, without a close frame.
func (c *crowd) add(group string, keep bool, plan ...pingWindow) *chatUser {
	u := &chatUser{
		uid:   fmt.Sprintf("%s-%02d", group, len(c.users)),
		group: group,
		idx:   len(c.users),
		plan:  plan,
		keep:  keep,
		crowd: c,
	}
	u.token = mintFor(c.r, u.uid)
	c.users = append(c.users, u)
	c.wg.Go(u.run)
	return u
}

// stop ends every user's connection and waits for them.
func (c *crowd) stop() {
	c.once.Do(func() { close(c.quit) })
	c.wg.Wait()
}

// pingWindow is a time in which a user pings: at from, then every period
// until until. One whose until is not after from is one ping; a zero
// until lasts until the crowd stops.
type pingWindow struct{ from, until time.Time }

// chatUser is one simulated user: a WebSocket client that reconnects with
// its token whenever its connection drops within a window, and tracks
// the deadline its pings were granted.
type chatUser struct {
	uid, token, group string
	idx               int
	plan              []pingWindow
	keep              bool
	crowd             *crowd

	mu sync.Mutex
	// low is the latest deadline a pong proved: a ping's send time plus
	// the TTL granted, never later than Redis's deadline. high bounds
	// the deadline the user may have from above: a ping's send time plus
	// the longest grant, or a pong's arrival plus its grant.
	low, high time.Time
	lastPing  time.Time
	// lateSelf counts pings the user's own timer sent past high: a host
	// that starved the client itself made it silent for a moment, and a
	// guide for that silence is no error of ours.
	lateSelf    int
	pongs       int
	unavailable int // pings answered "session store unavailable"
	dials       int
	failedDials int
}

func (u *chatUser) run() {
	var c *userConn
	defer func() {
		if c != nil {
			c.ws.Close()
		}
	}()
	for _, w := range u.plan {
		if !u.sleepUntil(w.from) {
			return
		}
		c = u.pingThrough(c, w.until)
	}
	if c != nil && !u.keep {
		c.drop()
		c = nil
	}
	<-u.crowd.quit
}

// pingThrough pings at once, then every period until until, reconnecting
// whenever the connection drops, and returns the connection it holds.
func (u *chatUser) pingThrough(c *userConn, until time.Time) *userConn {
	pinged := false
	timed := false // woken by the period's timer, not to reconnect
	for {
		if pinged && !until.IsZero() && !time.Now().Before(until) {
			return c
		}
		if c != nil && c.isGone() {
			c.ws.Close()
			c = nil
		}
		if c == nil {
			if c = u.connect(); c == nil {
				if !u.sleepUntil(time.Now().Add(redialPause)) {
					return nil
				}
				continue
			}
		}
		if err := c.ping(timed); err != nil {
			c.ws.Close()
			c = nil
			continue
		}
		pinged = true
		wait := u.crowd.period
		if !until.IsZero() {
			wait = min(wait, time.Until(until))
		}
		if wait <= 0 {
			return c
		}
		timer := time.NewTimer(wait)
		timed = false
		select {
		case <-u.crowd.quit:
			timer.Stop()
			return c
		case <-c.gone: // reconnect and ping at once
			timer.Stop()
		case <-timer.C:
			timed = true
		}
	}
}

// sleepUntil reports false if the crowd stopped first.
func (u *chatUser) sleepUntil(t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-u.crowd.quit:
		return false
	case <-timer.C:
		return true
	}
}

// connect dials one of the live gateway instances, a different one on
// each attempt.
func (u *chatUser) connect() *userConn {
	gws := u.crowd.r.liveGateways()
	u.mu.Lock()
	u.dials++
	n := u.dials
	u.mu.Unlock()
	fail := func() *userConn {
		u.mu.Lock()
		u.failedDials++
		u.mu.Unlock()
		return nil
	}
	if len(gws) == 0 {
		return fail()
	}
	g := gws[(u.idx+n)%len(gws)]
	d := websocket.Dialer{HandshakeTimeout: time.Second}
	ws, _, err := d.Dial("ws://"+g.front.Addr()+"/v1/ws", wsHeader(u.token))
	if err != nil {
		return fail()
	}
	c := &userConn{u: u, ws: ws, gone: make(chan struct{})}
	u.crowd.wg.Go(c.read)
	return c
}

// deadlines returns the bounds of the user's deadline.
func (u *chatUser) deadlines() (low, high time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.low, u.high
}

// userConn is one connection of a user. The user's goroutine writes;
// read, on a goroutine of its own, is the only reader.
type userConn struct {
	u    *chatUser
	ws   *websocket.Conn
	gone chan struct{} // closed when the read side ends

	mu      sync.Mutex
	pending []time.Time // send times of pings not yet answered, oldest first
}

// ping sends a ping; timed says the period's timer sent it.
func (c *userConn) ping(timed bool) error {
	now := time.Now()
	c.mu.Lock()
	c.pending = append(c.pending, now)
	c.mu.Unlock()
	c.u.mu.Lock()
	if timed && !c.u.high.IsZero() && now.After(c.u.high) {
		c.u.lateSelf++
	}
	c.u.lastPing = now
	c.u.high = later(c.u.high, now.Add(faultTTL+faultJitter))
	c.u.mu.Unlock()
	c.ws.SetWriteDeadline(now.Add(time.Second))
	return c.ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
}

// read takes the gateway's answers. The gateway answers a connection's
// pings in order, each with a pong or an error, so the oldest ping
// pending is the one answered.
func (c *userConn) read() {
	defer close(c.gone)
	for {
		_, b, err := c.ws.ReadMessage()
		if err != nil {
			return
		}
		at := time.Now()
		var f serverFrame
		if json.Unmarshal(b, &f) != nil {
			continue
		}
		switch {
		case f.Type == "pong":
			sent, ok := c.answered()
			ttl := time.Duration(f.TTLMS) * time.Millisecond
			c.u.mu.Lock()
			c.u.pongs++
			if ok {
				c.u.low = later(c.u.low, sent.Add(ttl))
			}
			c.u.high = later(c.u.high, at.Add(ttl))
			c.u.mu.Unlock()
		case f.Type == "error" && f.Code == frame.CodeUnavailable:
			c.answered()
			c.u.mu.Lock()
			c.u.unavailable++
			c.u.mu.Unlock()
		}
	}
}

func (c *userConn) answered() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return time.Time{}, false
	}
	sent := c.pending[0]
	c.pending = c.pending[1:]
	return sent, true
}

func (c *userConn) isGone() bool {
	select {
	case <-c.gone:
		return true
	default:
		return false
	}
}

// drop waits for the pings in flight to be answered (a second at most),
// so the deadline they were granted is known, then loses the connection
// as a network would: no close frame, and the session runs out.
func (c *userConn) drop() {
	waitFor(time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.pending) == 0 || c.isGone()
	})
	c.ws.Close()
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
