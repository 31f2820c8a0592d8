package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/chatsim"
)

// Timing of a user's connection, as a chat app would have it.
const (
	// handshakeTimeout bounds one connect.
	handshakeTimeout = 2 * time.Second
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

// user is one chat user (a chatsim.User) that reconnects on its own
// whenever its connection drops (at once, then after growing pauses) and
// pings on every connect and every period after, until its silence
// begins. A silent user is an app left open by someone who walked away:
// it keeps its connection, and reconnects when dropped, but pings no
// more. An active user's silence never begins.
//
// A ping answered "session store unavailable" counts toward the
// deadline the user is owed (chatsim.User.UnavailableGrants): the user
// was there, so a guide before it came while they were.
type user struct {
	*chatsim.User
	uid       string
	idx       int
	set       int          // the fault whose silent users it is among, or -1 for active throughout
	silenceAt atomic.Int64 // Unix ns; zero until the schedule sets it
}

// newUser returns the user uid of set, signed in with tok.
func (c *crowd) newUser(uid, tok string, set int) *user {
	return &user{
		User: &chatsim.User{
			UID:               uid,
			Token:             tok,
			TTL:               c.ttl,
			Jitter:            c.jitter,
			UnavailableGrants: true,
			Dialer:            &websocket.Dialer{HandshakeTimeout: handshakeTimeout, ReadBufferSize: 512, WriteBufferSize: 512},
			Readers:           &c.wg,
		},
		uid: uid,
		idx: len(c.users),
		set: set,
	}
}

func (u *user) silent(now time.Time) bool {
	at := u.silenceAt.Load()
	return at != 0 && now.UnixNano() >= at
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
		if u.Record().Pongs > 0 {
			n++
		}
	}
	return n
}

func (u *user) run(ctx context.Context, c *crowd) {
	var conn *chatsim.Conn
	defer func() {
		if conn != nil {
			conn.Close()
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
			if err := u.ping(conn, false); err != nil {
				conn.Close()
				conn = nil
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-conn.Gone():
			conn.Close()
			conn = nil
		case <-tick.C:
			if err := u.ping(conn, true); err != nil {
				conn.Close()
				conn = nil
			}
		}
	}
}

// dial connects to a gateway, the next one on each attempt, as a load
// balancer would spread them.
func (u *user) dial(ctx context.Context, c *crowd) *chatsim.Conn {
	return u.Dial(ctx, func(n int) (string, bool) {
		return c.urls[(u.idx+n)%len(c.urls)], true
	})
}

// ping sends one ping, unless the user's silence has begun.
func (u *user) ping(conn *chatsim.Conn, timed bool) error {
	if u.silent(time.Now()) {
		return nil
	}
	return conn.Ping(timed)
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
