package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
)

// Timing of a user's connection, as a chat app would have it.
const (
	// handshakeTimeout bounds one connect.
	handshakeTimeout = 2 * time.Second
	// writeWait bounds the write of one ping.
	writeWait = time.Second
	// redialMin and redialMax bound the pause after a failed connect: it
	// doubles from the first to the second, with jitter, so that a fleet
	// of users reconnecting does not arrive in lockstep.
	redialMin = 100 * time.Millisecond
	redialMax = 2 * time.Second
)

// crowd is the chat users of a run, connected to the gateways' fixed
// addresses.
type crowd struct {
	urls   []string      // the gateways' WebSocket URLs; restarts keep them
	ttl    time.Duration // the gateways' session TTL, jitter left out
	jitter time.Duration
	period time.Duration // between two pings of an active user

	users []*user
	wg    sync.WaitGroup // users and their connections' readers
}

// user is one chat user: a WebSocket client that reconnects on its own
// whenever its connection drops (at once, then after growing pauses) and
// pings on every connect and every period after, until its silence
// begins. A silent user is an app left open by someone who walked away:
// it keeps its connection, and reconnects when dropped, but pings no
// more. An active user's silence never begins.
type user struct {
	uid, token string
	idx        int
	set        int          // the fault whose silent users it is among, or -1 for active throughout
	silenceAt  atomic.Int64 // Unix ns; zero until the schedule sets it

	mu sync.Mutex
	// low is the latest deadline a ping answered by the gateway earned:
	// its send time plus the TTL a pong granted, or plus the TTL alone
	// when the gateway answered that the session store was unavailable
	// (the user was there; the gateway owes them that deadline). A guide
	// before low came while the user was there.
	low time.Time
	// high bounds the deadline from above: a ping's send time plus the
	// longest grant, or a pong's arrival plus its grant (a renewal the
	// gateway wrote late, after an outage).
	high                                         time.Time
	pings, pongs, unavailable, dials, failedDial int
}

func (u *user) silent(now time.Time) bool {
	at := u.silenceAt.Load()
	return at != 0 && now.UnixNano() >= at
}

// deadlines returns low and high.
func (u *user) deadlines() (low, high time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.low, u.high
}

// start runs every user until ctx ends, connecting them at ramp per
// second.
func (c *crowd) start(ctx context.Context, ramp int) {
	gap := time.Second / time.Duration(max(ramp, 1))
	c.wg.Go(func() {
		for _, u := range c.users {
			c.wg.Go(func() { u.run(ctx, c) })
			if !sleepCtx(ctx, gap) {
				return
			}
		}
	})
}

// wait waits for every user and connection to end, after ctx did.
func (c *crowd) wait() { c.wg.Wait() }

// pinged reports how many users had a ping answered with a pong.
func (c *crowd) pinged() int {
	n := 0
	for _, u := range c.users {
		u.mu.Lock()
		if u.pongs > 0 {
			n++
		}
		u.mu.Unlock()
	}
	return n
}

func (u *user) run(ctx context.Context, c *crowd) {
	var conn *userConn
	defer func() {
		if conn != nil {
			conn.ws.Close()
		}
	}()
	pause := redialMin
	tick := time.NewTicker(c.period)
	defer tick.Stop()
	for {
		if conn == nil {
			if conn = u.dial(ctx, c); conn == nil {
				if !sleepCtx(ctx, pause/2+rand.N(pause/2)) {
					return
				}
				pause = min(2*pause, redialMax)
				continue
			}
			pause = redialMin
			tick.Reset(c.period)
			if err := u.ping(conn, c); err != nil {
				conn.ws.Close()
				conn = nil
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-conn.gone:
			conn.ws.Close()
			conn = nil
		case <-tick.C:
			if err := u.ping(conn, c); err != nil {
				conn.ws.Close()
				conn = nil
			}
		}
	}
}

// dial connects to a gateway, the next one on each attempt, as a load
// balancer would spread them.
func (u *user) dial(ctx context.Context, c *crowd) *userConn {
	u.mu.Lock()
	u.dials++
	url := c.urls[(u.idx+u.dials)%len(c.urls)]
	u.mu.Unlock()
	d := websocket.Dialer{HandshakeTimeout: handshakeTimeout, ReadBufferSize: 512, WriteBufferSize: 512}
	ws, _, err := d.DialContext(ctx, url, http.Header{"Authorization": {"Bearer " + u.token}})
	if err != nil {
		u.mu.Lock()
		u.failedDial++
		u.mu.Unlock()
		return nil
	}
	conn := &userConn{u: u, ttl: c.ttl, ws: ws, gone: make(chan struct{})}
	c.wg.Go(conn.read)
	return conn
}

// ping sends one ping, unless the user's silence has begun.
func (u *user) ping(conn *userConn, c *crowd) error {
	now := time.Now()
	if u.silent(now) {
		return nil
	}
	conn.mu.Lock()
	conn.pending = append(conn.pending, now)
	conn.mu.Unlock()
	u.mu.Lock()
	u.pings++
	u.high = later(u.high, now.Add(c.ttl+c.jitter))
	u.mu.Unlock()
	conn.ws.SetWriteDeadline(now.Add(writeWait))
	return conn.ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
}

// userConn is one connection of a user. The user's goroutine writes;
// read, on a goroutine of its own, is the only reader.
type userConn struct {
	u    *user
	ttl  time.Duration
	ws   *websocket.Conn
	gone chan struct{} // closed when the read side ends

	mu      sync.Mutex
	pending []time.Time // send times of pings not answered yet, oldest first
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
		var f struct {
			Type  string `json:"type"`
			Code  string `json:"code"`
			TTLMS int64  `json:"ttl_ms"`
		}
		if json.Unmarshal(b, &f) != nil {
			continue
		}
		switch {
		case f.Type == "pong":
			ttl := time.Duration(f.TTLMS) * time.Millisecond
			sent, ok := c.answered()
			c.u.mu.Lock()
			c.u.pongs++
			if ok {
				c.u.low = later(c.u.low, sent.Add(ttl))
			}
			c.u.high = later(c.u.high, at.Add(ttl))
			c.u.mu.Unlock()
		case f.Type == "error" && f.Code == frame.CodeUnavailable:
			sent, ok := c.answered()
			c.u.mu.Lock()
			c.u.unavailable++
			if ok {
				c.u.low = later(c.u.low, sent.Add(c.ttl))
			}
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

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// sleepCtx reports false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
