package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/promise"
)

// Timing of a user's connections and signals.
const (
	handshakeTimeout = 2 * time.Second
	// redialMin and redialMax bound the pause after a failed connect: it
	// doubles from one to the other, with jitter.
	redialMin = 100 * time.Millisecond
	redialMax = 2 * time.Second
	// answerWait is how long a ping waits for its answer before it
	// counts as unanswered (an activity post, resent while refused, has
	// resendWithin). A device then leaves its
	// gateway for another, as the protocol's client does after its
	// pongTimeout (the renewal interval, at least 2 s): a gateway frozen
	// or cut off without closing the connection answers nothing, ever.
	answerWait = 2 * time.Second
	// postAttempt is how long one activity post waits on one gateway
	// before the platform's client tries the next, as one behind a load
	// balancer does, within resendWithin in all.
	postAttempt = time.Second
	// readWait is how long a device's reader waits for a frame before it
	// looks at its context again.
	readWait = 500 * time.Millisecond
)

// crowd is the run's users. WebSocket users ping through one of their
// devices (some have two); activity users are reported by their
// platform through the activity endpoint (active, turns to them and to
// us) and have one device that only receives their guides.
type crowd struct {
	r     *rig
	rec   *recorder
	ttl   time.Duration
	users []*user
	wg    sync.WaitGroup // drivers, devices and their readers
	// postURL, when set, is the activity endpoint of a user's nth try
	// (the user's index plus n); else the gateways' in turn.
	postURL func(i int) string
}

// user is one simulated user. Its driver alternates presence (a signal
// every ttl/3 or so) and silence (short, or long enough for every stage),
// drawn from its own seeded source.
type user struct {
	uid      string
	idx      int
	activity bool // reported through the activity endpoint
	devices  []*device
	rnd      *rand.Rand
	first    atomic.Bool // a first signal was answered
	// lastTurnUs: the last activity event was a turn to us. The next is
	// not another: see nextActivity.
	lastTurnUs bool
	// hushedUntil (Unix ns) silences the user whatever its driver
	// draws: a mass silence.
	hushedUntil atomic.Int64
}

// hush silences the users whose index is k modulo n until until.
func (c *crowd) hush(k, n int, until time.Time) {
	for _, u := range c.users {
		if u.idx%n == k {
			u.hushedUntil.Store(until.UnixNano())
		}
	}
}

// device is one connection of a user's, kept open: it reconnects when
// dropped (a close stage's 4000 included), reads every frame, and acks
// guides, as an app does.
type device struct {
	sink string
	chat *chatsim.User
	conn atomic.Pointer[chatsim.Conn]
	// wake ends a device's wait after a close stage (4000): the
	// protocol's client does not reconnect on its own then, but when its
	// user comes back.
	wake chan struct{}
}

func newCrowd(r *rig, rec *recorder, seed uint64, wsUsers, actUsers, twoDevices int) (*crowd, error) {
	c := &crowd{r: r, rec: rec, ttl: r.s.ttl}
	for i := range wsUsers + actUsers {
		u := &user{idx: i, activity: i >= wsUsers, rnd: rand.New(rand.NewPCG(seed, uint64(i)))}
		u.uid = fmt.Sprintf("ws-%03d", i)
		n := 1
		if u.activity {
			u.uid = fmt.Sprintf("act-%03d", i)
		} else if i < twoDevices {
			n = 2
		}
		tok, err := chatsim.Token([]byte(r.tokenSecret), u.uid, "")
		if err != nil {
			return nil, err
		}
		for k := range n {
			u.devices = append(u.devices, &device{
				sink: fmt.Sprintf("%s/dev%d", u.uid, k),
				wake: make(chan struct{}, 1),
				chat: &chatsim.User{UID: u.uid, Token: tok, TTL: r.s.ttl, Readers: &c.wg,
					Dialer: &websocket.Dialer{HandshakeTimeout: handshakeTimeout, ReadBufferSize: 1024, WriteBufferSize: 1024}},
			})
		}
		c.users = append(c.users, u)
	}
	return c, nil
}

// start runs every device until devCtx ends, and every driver until ctx
// does. Once calm is closed the drivers stop falling silent: each user
// comes back, if away, and signals every period to the end, so that the
// run ends with no burst of silences that began together.
func (c *crowd) start(ctx, devCtx context.Context, calm <-chan struct{}) {
	for _, u := range c.users {
		for k, d := range u.devices {
			c.wg.Go(func() { c.runDevice(devCtx, u, k, d) })
		}
		c.wg.Go(func() { c.drive(ctx, u, calm) })
	}
	c.wg.Go(func() { c.refreshTokens(devCtx, tokenRefresh) })
}

// tokenRefresh is how often the devices get fresh tokens, well within a
// token's life: a run longer than that would otherwise see every device
// cut off as its token ran out, and refused on each redial, as a client
// whose backend never renewed its token is.
const tokenRefresh = 20 * time.Minute

// refreshTokens gives every device a fresh token each period, for its
// later dials and, in an auth frame, its connection that lasts, until ctx
// ends.
func (c *crowd) refreshTokens(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, u := range c.users {
			tok, err := chatsim.Token([]byte(c.r.tokenSecret), u.uid, "")
			if err != nil {
				c.rec.wrong(fmt.Sprintf("%s: mint a fresh token: %v", u.uid, err))
				continue
			}
			for _, d := range u.devices {
				d.chat.SetToken(tok)
				if conn := d.conn.Load(); conn != nil {
					// A connection that ends meanwhile redials with it.
					conn.Auth(tok)
				}
			}
		}
	}
}

func (c *crowd) wait() { c.wg.Wait() }

// ready reports how many users had a first signal answered.
func (c *crowd) ready() int {
	n := 0
	for _, u := range c.users {
		if u.first.Load() {
			n++
		}
	}
	return n
}

func (c *crowd) runDevice(ctx context.Context, u *user, k int, d *device) {
	pause := redialMin
	for n := 0; ctx.Err() == nil; n++ {
		url := c.r.publicURL((u.idx + k + n) % nGateways)
		conn, err := d.chat.Connect(ctx, url)
		if err != nil {
			if !sleepCtx(ctx, pause/2+time.Duration(rand.Int64N(int64(pause/2)))) {
				return
			}
			pause = min(2*pause, redialMax)
			continue
		}
		pause = redialMin
		d.conn.Store(conn)
		c.read(ctx, u, d, conn)
		d.conn.Store(nil)
		conn.Close()
		if conn.CloseCode() == closeInactive {
			select {
			case <-d.wake:
			case <-ctx.Done():
				return
			}
		}
	}
}

// closeInactive is the close code after a close stage: the chat is
// closed, and the client connects again when its user comes back.
const closeInactive = 4000

// reconnectWait bounds how long a user who comes back waits for one of
// their devices to connect before their signal counts as unsent.
const reconnectWait = 2 * time.Second

// live returns u's devices' connections that last, waking the devices
// that wait after a close stage and waiting (reconnectWait at most) for
// one when none lasts.
func (u *user) live() []*chatsim.Conn {
	var out []*chatsim.Conn
	deadline := time.Now().Add(reconnectWait)
	for {
		for _, d := range u.devices {
			if conn := d.conn.Load(); conn != nil && !conn.IsGone() {
				out = append(out, conn)
			}
		}
		if len(out) > 0 || time.Now().After(deadline) {
			return out
		}
		for _, d := range u.devices {
			select {
			case d.wake <- struct{}{}:
			default:
			}
		}
		time.Sleep(20 * time.Millisecond) // a poll of the devices' state
	}
}

// read takes conn's frames until it ends, recording and acking guides.
func (c *crowd) read(ctx context.Context, u *user, d *device, conn *chatsim.Conn) {
	for ctx.Err() == nil {
		f, err := conn.Next(readWait)
		if errors.Is(err, chatsim.ErrNoAnswer) {
			continue
		}
		if err != nil {
			return
		}
		if f.Type != frame.TypeGuide {
			continue
		}
		del, err := guideDelivery(u.uid, d.sink, f)
		if err != nil {
			c.rec.wrong(fmt.Sprintf("%s: %v: %s", d.sink, err, f))
			continue
		}
		c.rec.delivery(del)
		conn.Ack(f.ID)
	}
}

// drive is the user's behaviour until ctx ends: presence and silence,
// then only presence once calm is closed.
func (c *crowd) drive(ctx context.Context, u *user, calm <-chan struct{}) {
	period := c.ttl / 3
	calmed := func() bool {
		select {
		case <-calm:
			return true
		default:
			return false
		}
	}
	for ctx.Err() == nil {
		present := time.Now().Add(time.Duration(5+u.rnd.IntN(25)) * time.Second)
		for time.Now().Before(present) || calmed() {
			if time.Now().UnixNano() >= u.hushedUntil.Load() && c.signal(ctx, u) {
				// Unanswered: the activity it carried is owed, and goes
				// out on the device's next connection at once, as the
				// protocol's client sends it as its socket opens.
				c.signal(ctx, u)
			}
			if !sleepCtx(ctx, period*time.Duration(80+u.rnd.IntN(40))/100) {
				return
			}
		}
		t := time.NewTimer(u.silence(c.ttl, c.r.s.closeAfter))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-calm:
			t.Stop()
		case <-t.C:
		}
	}
}

// silence draws how long the user stays away: shorter than the TTL (no
// silence), into its stages (back between the reminder and the close),
// or past every stage.
func (u *user) silence(ttl, closeAfter time.Duration) time.Duration {
	switch p := u.rnd.IntN(10); {
	case p < 3:
		return ttl * time.Duration(20+u.rnd.IntN(50)) / 100
	case p < 5:
		return ttl + time.Duration(u.rnd.Int64N(int64(closeAfter)))
	default:
		return ttl + closeAfter + time.Duration(2+u.rnd.IntN(10))*time.Second
	}
}

// signal sends one signal of u's: a ping through one of its connected
// devices, or an activity event. It reports whether a ping went
// unanswered, and its device left the gateway for another.
func (c *crowd) signal(ctx context.Context, u *user) (left bool) {
	if u.activity {
		for _, d := range u.devices {
			select {
			case d.wake <- struct{}{}:
			default:
			}
		}
		c.post(ctx, u, u.nextActivity(c.ttl))
		return false
	}
	live := u.live()
	now := time.Now()
	if len(live) == 0 {
		c.rec.signal(unreachedSignal(u.uid, now, c.ttl))
		return false
	}
	conn := live[u.rnd.IntN(len(live))]
	ch, err := conn.PingAnswer()
	if err != nil {
		c.rec.signal(pingSignal(u.uid, now, chatsim.Answer{}, err, c.ttl))
		return false
	}
	t := time.NewTimer(answerWait)
	defer t.Stop()
	select {
	case a := <-ch:
		if !a.Unavailable {
			u.first.Store(true)
		}
		c.rec.signal(pingSignal(u.uid, now, a, nil, c.ttl))
		return false
	case <-conn.Gone():
		err = chatsim.ErrGone
	case <-t.C:
		err = chatsim.ErrNoAnswer
		// Its gateway answers nothing: the device connects again, to
		// another, and the user's next signal goes there.
		conn.Close()
		left = true
	}
	i := c.rec.signal(pingSignal(u.uid, now, chatsim.Answer{}, err, c.ttl))
	// The answer may still come, as long as the connection lasts: the
	// deadline it names is the one the session got.
	c.wg.Go(func() {
		select {
		case a := <-ch:
			c.rec.answered(i, pingSignal(u.uid, now, a, nil, c.ttl))
		case <-conn.Gone():
			select {
			case a := <-ch:
				c.rec.answered(i, pingSignal(u.uid, now, a, nil, c.ttl))
			default:
			}
		case <-ctx.Done():
		}
	})
	return left
}

// nextActivity draws an event: mostly "active", some turns. A turn to
// us never follows a turn to us: what a second one with a shorter max_ms
// does to the first one's hold is not settled between the service (it
// keeps the longer) and the checker (it takes the last), so the run does
// not ask it.
func (u *user) nextActivity(ttl time.Duration) activity {
	p := u.rnd.IntN(20)
	if u.lastTurnUs && p >= 17 {
		p = 13 // a turn to the user instead
	}
	var ev activity
	switch {
	case p < 13:
		ev = activity{kind: promise.Ping}
	case p < 17:
		ev = activity{kind: promise.TurnToUser}
	default:
		ev = activity{kind: promise.TurnToUs, hold: time.Duration(1+u.rnd.IntN(int(2*ttl/time.Second))) * time.Second}
	}
	u.lastTurnUs = ev.kind == promise.TurnToUs
	return ev
}

// post sends one event to the activity endpoint of the user's gateway,
// and sends it again while it is refused, as the protocol asks of a
// platform (see resend). The signal it records is the event: its time is
// its at_ms, whenever a resend applied it, and its outcome the final
// answer.
func (c *crowd) post(ctx context.Context, u *user, ev activity) {
	sent := time.Now()
	e := map[string]any{"uid": u.uid, "at_ms": sent.UnixMilli()}
	switch ev.kind {
	case promise.Ping:
		e["kind"] = "active"
	case promise.TurnToUser:
		e["kind"], e["to"] = "turn", "user"
	case promise.TurnToUs:
		e["kind"], e["to"], e["max_ms"] = "turn", "us", ev.hold.Milliseconds()
	}
	body, _ := json.Marshal(map[string]any{"events": []any{e}})
	a := c.resend(ctx, body, func(n int) string {
		if c.postURL != nil {
			return c.postURL(u.idx + n)
		}
		return c.r.activityURL((u.idx + n) % nGateways)
	})
	if a.status/100 == 4 {
		c.rec.wrong(fmt.Sprintf("activity %s: HTTP %d: %s", body, a.status, a.body))
	}
	if ctx.Err() != nil {
		return // the run ended: no answer to judge
	}
	if a.status == http.StatusOK {
		u.first.Store(true)
	}
	c.rec.signal(activitySignal(u.uid, ev, sent, a.status, a.err, a.at, c.ttl))
}

// Resending an activity batch.
const (
	// resendWithin bounds a post and its resends, from its first try: a
	// platform that sends a refused batch again does so for a while, not
	// for ever. Within the default TTL, so that an event applied by its
	// last resend still sets a deadline to come.
	resendWithin = answerWait + time.Second
	// resendMin and resendMax bound the pause before a resend, when the
	// answer names no Retry-After: it doubles from one to the other.
	resendMin = 100 * time.Millisecond
	resendMax = time.Second
)

// errUnanswered is the outcome of a post whose final try was refused (or
// not made) after an earlier try went unanswered: that try may still
// apply the event, late.
var errUnanswered = errors.New("an earlier try went unanswered")

// postAnswer is what became of a post and its resends: the final
// answer's status (0: none) and body, or its error, and when it came.
type postAnswer struct {
	status int
	body   []byte
	err    error
	at     time.Time
}

// resend posts body, the same batch each time (its events keep their
// at_ms, so a late or second application sets the same deadline), to
// url(0), url(1), ..., as a platform behind a load balancer does: a
// gateway that does not take the connection, or does not answer within
// an attempt, is passed over for the next at once; after a 503 (Redis
// out of reach: "send the whole batch again"), or once every gateway
// failed in turn, it waits (the answer's Retry-After, else a pause that
// doubles from resendMin to resendMax) and sends it again, within
// resendWithin in all. Any other answer is final.
//
// The outcome is the final answer, but for one thing: when the batch is
// given up on refused or unanswered after a try that went unanswered (it
// may still be applied, late), it is unanswered (errUnanswered), not
// refused: a 503 says only that its own try applied nothing.
func (c *crowd) resend(ctx context.Context, body []byte, url func(n int) string) postAnswer {
	rctx, cancel := context.WithTimeout(ctx, resendWithin)
	defer cancel()
	deadline, _ := rctx.Deadline()
	var a postAnswer
	lost := false // a try went unanswered, and may have applied
	pause := resendMin
	for n := 0; ; n++ {
		var retryAfter time.Duration
		a.status, a.body, retryAfter, a.err = c.postTo(rctx, url(n), body)
		a.at = time.Now()
		if a.err != nil && !errors.Is(a.err, syscall.ECONNREFUSED) {
			lost = true // sent, perhaps, and not answered
		}
		if a.err == nil && a.status != http.StatusServiceUnavailable {
			break
		}
		var wait time.Duration
		switch {
		case a.err == nil: // 503
			wait = cmp.Or(retryAfter, pause)
		case (n+1)%nGateways != 0:
			wait = 0 // the next gateway, at once
		default:
			wait = pause
		}
		if wait > 0 {
			pause = min(2*pause, resendMax)
		}
		if rctx.Err() != nil || time.Until(deadline) <= wait || !sleepCtx(rctx, wait) {
			break
		}
	}
	if a.status != http.StatusOK && lost {
		a.status, a.body, a.err = 0, nil, errUnanswered
	}
	return a
}

// postTo posts body to url and reads the answer (its first 4 KB) and its
// Retry-After (0: none), waiting postAttempt at most.
func (c *crowd) postTo(ctx context.Context, url string, body []byte) (status int, answer []byte, retryAfter time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, postAttempt)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+c.r.activitySecret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	answer, err = io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return 0, nil, 0, err // the answer broke off: not read
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		retryAfter = time.Duration(s) * time.Second
	}
	return resp.StatusCode, answer, retryAfter, nil
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
