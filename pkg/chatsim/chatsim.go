// Package chatsim is a simulated chat user, for the dev stack's tests and
// the outage bench: a WebSocket client of the gateway that connects with
// its token, pings, reads the answers, and records what they proved about
// the deadline its session holds. When to ping, connect and drop is the
// caller's: it is what each test or bench is about.
package chatsim

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
)

// Timing of one connection.
const (
	// writeWait bounds the write of one ping.
	writeWait = time.Second
	// dropWait bounds how long Drop waits for the pings in flight to be
	// answered.
	dropWait = time.Second
	// dropPoll is how often Drop looks whether they were.
	dropPoll = 5 * time.Millisecond
)

// User is one simulated chat user. Set its fields before the first Dial;
// its record is safe to read while its connections run.
type User struct {
	UID, Token string
	// TTL and Jitter are the gateway's session TTL and its jitter: a ping
	// grants at most TTL+Jitter past its send time.
	TTL, Jitter time.Duration
	// UnavailableGrants says that a ping answered "session store
	// unavailable" still proves the deadline its send time plus TTL: the
	// user was there, and the gateway owes them that deadline. Zero: such
	// an answer proves nothing.
	UnavailableGrants bool
	// Dialer connects; nil is websocket.DefaultDialer.
	Dialer *websocket.Dialer
	// Readers counts the connections' readers, which Dial starts; the
	// owner of the user waits on it once every connection is closed.
	Readers *sync.WaitGroup

	mu  sync.Mutex
	rec Record
}

// Record is what a user did and what the gateway's answers proved.
type Record struct {
	// Low is the latest deadline an answered ping proved: its send time
	// plus the TTL its pong granted, never later than Redis's deadline. A
	// guide before Low came while the user was there.
	Low time.Time
	// High bounds the deadline the user may have from above: a ping's
	// send time plus the longest grant, or a pong's arrival plus its grant
	// (a renewal the gateway wrote late, after an outage).
	High time.Time
	// LastPing is when the latest ping was sent.
	LastPing time.Time
	// LateSelf counts timed pings sent past High: a host that starved the
	// client itself made it silent for a moment, and a guide for that
	// silence is no error of the gateway's.
	LateSelf int
	Pings    int
	Pongs    int
	// Unavailable counts pings answered "session store unavailable".
	Unavailable int
	Dials       int
	FailedDials int
}

// Record returns a copy of the user's record.
func (u *User) Record() Record {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.rec
}

// Deadlines returns the bounds of the user's deadline.
func (u *User) Deadlines() (low, high time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.rec.Low, u.rec.High
}

// Dial connects to the gateway at the URL pick returns for this dial, the
// nth of the user's (from 1), so that a caller can spread attempts over
// gateways as a load balancer would; pick returns false when there is
// none to try, which counts as a failed dial. Dial returns nil if the
// connect failed.
func (u *User) Dial(ctx context.Context, pick func(n int) (url string, ok bool)) *Conn {
	u.mu.Lock()
	u.rec.Dials++
	n := u.rec.Dials
	u.mu.Unlock()
	url, ok := pick(n)
	var ws *websocket.Conn
	if ok {
		d := u.Dialer
		if d == nil {
			d = websocket.DefaultDialer
		}
		var err error
		ws, _, err = d.DialContext(ctx, url, http.Header{"Authorization": {"Bearer " + u.Token}})
		ok = err == nil
	}
	if !ok {
		u.mu.Lock()
		u.rec.FailedDials++
		u.mu.Unlock()
		return nil
	}
	c := &Conn{u: u, ws: ws, gone: make(chan struct{})}
	u.Readers.Go(c.read)
	return c
}

// Conn is one connection of a user. The user's goroutine writes; read,
// on a goroutine of its own, is the only reader.
type Conn struct {
	u    *User
	ws   *websocket.Conn
	gone chan struct{} // closed when the read side ends

	mu      sync.Mutex
	pending []time.Time // send times of pings not answered yet, oldest first
}

// Ping sends a ping; timed says the caller's period timer sent it (and
// not a connect), so that one sent past High counts as LateSelf.
func (c *Conn) Ping(timed bool) error {
	now := time.Now()
	c.mu.Lock()
	c.pending = append(c.pending, now)
	c.mu.Unlock()
	u := c.u
	u.mu.Lock()
	if timed && !u.rec.High.IsZero() && now.After(u.rec.High) {
		u.rec.LateSelf++
	}
	u.rec.Pings++
	u.rec.LastPing = now
	u.rec.High = later(u.rec.High, now.Add(u.TTL+u.Jitter))
	u.mu.Unlock()
	c.ws.SetWriteDeadline(now.Add(writeWait))
	return c.ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
}

// Gone is closed when the connection's read side ends.
func (c *Conn) Gone() <-chan struct{} { return c.gone }

// IsGone reports whether the read side ended.
func (c *Conn) IsGone() bool {
	select {
	case <-c.gone:
		return true
	default:
		return false
	}
}

// Close closes the connection at once, without a close frame.
func (c *Conn) Close() error { return c.ws.Close() }

// Drop waits for the pings in flight to be answered (dropWait at most),
// so the deadline they were granted is known, then loses the connection
// as a network would: no close frame, and the session runs out.
func (c *Conn) Drop() {
	deadline := time.Now().Add(dropWait)
	tick := time.NewTicker(dropPoll)
	defer tick.Stop()
	for !c.settled() && time.Now().Before(deadline) {
		<-tick.C
	}
	c.ws.Close()
}

func (c *Conn) settled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) == 0 || c.IsGone()
}

// read takes the gateway's answers. The gateway answers a connection's
// pings in order, each with a pong or an error, so the oldest ping
// pending is the one answered.
func (c *Conn) read() {
	defer close(c.gone)
	u := c.u
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
			u.mu.Lock()
			u.rec.Pongs++
			if ok {
				u.rec.Low = later(u.rec.Low, sent.Add(ttl))
			}
			u.rec.High = later(u.rec.High, at.Add(ttl))
			u.mu.Unlock()
		case f.Type == "error" && f.Code == frame.CodeUnavailable:
			sent, ok := c.answered()
			u.mu.Lock()
			u.rec.Unavailable++
			if ok && u.UnavailableGrants {
				u.rec.Low = later(u.rec.Low, sent.Add(u.TTL))
			}
			u.mu.Unlock()
		}
	}
}

func (c *Conn) answered() (time.Time, bool) {
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
