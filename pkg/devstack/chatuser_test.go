package devstack

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/chatsim"
)

// redialPause is how long a user waits after a failed connect.
const redialPause = 100 * time.Millisecond

// answerWait bounds the wait for the answer to a ping, or to a normal
// close, in the tests that wait for it.
const answerWait = 5 * time.Second

// connectAs connects u at url, and closes the connection at cleanup once
// the test is done with it, waiting for its reader.
func connectAs(t testing.TB, u *chatsim.User, url string) *chatsim.Conn {
	t.Helper()
	c, err := u.Connect(context.Background(), url)
	if err != nil {
		t.Fatalf("dial %s as %s: %v", url, u.UID, err)
	}
	t.Cleanup(func() {
		c.Close()
		<-c.Gone()
	})
	return c
}

// pingConn pings on c and returns the bounds of the deadline the pong
// proves: Redis renewed the session between the send and the pong, for
// its ttl_ms. Any other answer, or none, fails the test.
func pingConn(t testing.TB, c *chatsim.Conn) (low, high time.Time) {
	t.Helper()
	low, high, err := tryPing(c)
	if err != nil {
		t.Fatal(err)
	}
	return low, high
}

// tryPing is pingConn for a goroutine other than the test's.
func tryPing(c *chatsim.Conn) (low, high time.Time, err error) {
	a, err := c.PingWait(answerWait)
	switch {
	case err != nil:
		return low, high, fmt.Errorf("ping: %w", err)
	case a.Unavailable:
		return low, high, errors.New("ping answered: session store unavailable")
	}
	return a.Low(), a.High(), nil
}

// leave closes c with 1000, and checks that the gateway answered in kind.
func leave(t testing.TB, c *chatsim.Conn) {
	t.Helper()
	if err := c.Leave(answerWait); err != nil {
		t.Errorf("normal close answered with %v", err)
	}
}

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
	uid := fmt.Sprintf("%s-%02d", group, len(c.users))
	u := &chatUser{
		User: &chatsim.User{
			UID:     uid,
			Token:   mintFor(c.r, uid),
			TTL:     faultTTL,
			Jitter:  faultJitter,
			Dialer:  &websocket.Dialer{HandshakeTimeout: time.Second},
			Readers: &c.wg,
		},
		uid:   uid,
		group: group,
		idx:   len(c.users),
		plan:  plan,
		keep:  keep,
		crowd: c,
	}
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

// chatUser is one simulated user (a chatsim.User) that reconnects with
// its token whenever its connection drops within a window.
type chatUser struct {
	*chatsim.User
	uid, group string
	idx        int
	plan       []pingWindow
	keep       bool
	crowd      *crowd
}

func (u *chatUser) run() {
	var c *chatsim.Conn
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	for _, w := range u.plan {
		if !u.sleepUntil(w.from) {
			return
		}
		c = u.pingThrough(c, w.until)
	}
	if c != nil && !u.keep {
		c.Drop()
		c = nil
	}
	<-u.crowd.quit
}

// pingThrough pings at once, then every period until until, reconnecting
// whenever the connection drops, and returns the connection it holds.
func (u *chatUser) pingThrough(c *chatsim.Conn, until time.Time) *chatsim.Conn {
	pinged := false
	timed := false // woken by the period's timer, not to reconnect
	for {
		if pinged && !until.IsZero() && !time.Now().Before(until) {
			return c
		}
		if c != nil && c.IsGone() {
			c.Close()
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
		if err := c.Ping(timed); err != nil {
			c.Close()
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
		case <-c.Gone(): // reconnect and ping at once
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
func (u *chatUser) connect() *chatsim.Conn {
	return u.Dial(context.Background(), func(n int) (string, bool) {
		gws := u.crowd.r.liveGateways()
		if len(gws) == 0 {
			return "", false
		}
		return "ws://" + gws[(u.idx+n)%len(gws)].front.Addr() + "/v1/ws", true
	})
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
