// Package chatsim is a simulated chat user, for the dev stack's tests and
// the outage bench: a WebSocket client of the gateway that connects with
// its token, pings, reads the answers and the guides, and records what
// the answers proved about the deadline its session holds. When to ping,
// connect, leave and drop is the caller's: it is what each test or bench
// is about.
//
// Each connection has one reader, started by the dial, that takes every
// frame the gateway sends: an answer to a ping (a pong, or "session store
// unavailable") goes to the ping, and to the user's record; any other
// frame (a guide, an error) is kept, in order, for Next and Guides.
// Writes are serialized, so one goroutine may ping while another acks.
package chatsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/token"
)

// Timing of one connection.
const (
	// writeWait bounds the write of one frame.
	writeWait = time.Second
	// dropWait bounds how long Drop waits for the pings in flight to be
	// answered.
	dropWait = time.Second
	// dropPoll is how often Drop looks whether they were.
	dropPoll = 5 * time.Millisecond
	// tokenLife is how long a token from Token lasts: longer than any
	// test or bench run, so that no connection outlives its token.
	tokenLife = time.Hour
)

// Errors of a ping that waits for its answer.
var (
	// ErrGone: the connection ended before the answer came.
	ErrGone = errors.New("connection ended before the answer")
	// ErrNoAnswer: no answer came in the time given.
	ErrNoAnswer = errors.New("no answer in time")
)

// Token signs a token for uid in segment ("" for the default one) with
// the gateway's secret, as the chat backend issues them.
func Token(secret []byte, uid, segment string) (string, error) {
	return token.Mint(secret, uid, segment, tokenLife)
}

// User is one simulated chat user. Set its fields before the first dial;
// its record is safe to read while its connections run.
type User struct {
	UID string
	// Token is sent as a bearer token with every dial; empty sends none.
	// Set it before the first dial; SetToken replaces it later.
	Token string
	// Header is sent with every dial too (an Origin, say); nil for none.
	Header http.Header
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
	// Readers, when set, counts the connections' readers, which the dials
	// start; the owner of the user waits on it once every connection is
	// closed. Nil leaves them uncounted: the owner waits on each
	// connection's Gone instead.
	Readers *sync.WaitGroup

	mu  sync.Mutex
	rec Record
	// told is the deadline the answer to the ping sent at toldSent told.
	told, toldSent time.Time
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
	// LateSelf counts timed pings sent past the deadline the user had: a
	// host that starved the client itself made it silent for a moment,
	// and a guide for that silence is no error of the gateway's. Missed
	// holds those deadlines, as the pongs told them (Redis's, to the
	// millisecond), so that a guide can be matched to the one it was for.
	// The deadline is the one the user's latest ping was answered with;
	// while that ping is unanswered, no send counts as late (the gateway
	// owes its answer). Before any pong told a deadline, a send past High
	// counts, with no entry in Missed.
	LateSelf int
	Missed   []time.Time
	Pings    int
	Pongs    int
	// Unavailable counts pings answered "session store unavailable".
	Unavailable int
	// Guides counts the guides shown on any of the user's connections.
	Guides      int
	Dials       int
	FailedDials int
}

// Record returns a copy of the user's record.
func (u *User) Record() Record {
	u.mu.Lock()
	defer u.mu.Unlock()
	r := u.rec
	r.Missed = slices.Clone(r.Missed)
	return r
}

// SetToken replaces the token the user's later dials send, as a client
// does with the fresh token its backend issues before the last one runs
// out; Conn.Auth hands it to a connection that lasts.
func (u *User) SetToken(tok string) {
	u.mu.Lock()
	u.Token = tok
	u.mu.Unlock()
}

// CurrentToken is the token the user's next dial sends.
func (u *User) CurrentToken() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.Token
}

// Deadlines returns the bounds of the user's deadline.
func (u *User) Deadlines() (low, high time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.rec.Low, u.rec.High
}

// RefusedError is an upgrade the gateway refused with an HTTP answer.
type RefusedError struct {
	Status int
	// Body is the answer's body, as much of it as the dialer read.
	Body []byte
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("upgrade refused with HTTP %d: %s", e.Status, e.Body)
}

// Connect connects to the gateway at url (a ws:// URL; a query token is
// the caller's to put in it). An upgrade the gateway refused is a
// *RefusedError.
func (u *User) Connect(ctx context.Context, url string) (*Conn, error) {
	u.mu.Lock()
	u.rec.Dials++
	u.mu.Unlock()
	c, err := u.connect(ctx, url)
	if err != nil {
		u.mu.Lock()
		u.rec.FailedDials++
		u.mu.Unlock()
		return nil, err
	}
	return c, nil
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
	var c *Conn
	if url, ok := pick(n); ok {
		c, _ = u.connect(ctx, url)
	}
	if c == nil {
		u.mu.Lock()
		u.rec.FailedDials++
		u.mu.Unlock()
	}
	return c
}

func (u *User) connect(ctx context.Context, url string) (*Conn, error) {
	d := u.Dialer
	if d == nil {
		d = websocket.DefaultDialer
	}
	h := http.Header{}
	for k, v := range u.Header {
		h[k] = v
	}
	if tok := u.CurrentToken(); tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	ws, resp, err := d.DialContext(ctx, url, h)
	if err != nil {
		if resp != nil {
			// The dialer kept what it read of the body.
			body, _ := io.ReadAll(resp.Body)
			return nil, &RefusedError{Status: resp.StatusCode, Body: body}
		}
		return nil, err
	}
	c := &Conn{u: u, ws: ws, gone: make(chan struct{}), more: make(chan struct{})}
	// The protocol's answers, as gorilla's defaults give them, until the
	// connection is frozen.
	ws.SetPingHandler(func(data string) error {
		if c.frozen.Load() {
			return nil
		}
		// A failed write shows on the next read.
		ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(writeWait))
		return nil
	})
	ws.SetCloseHandler(func(code int, _ string) error {
		if !c.frozen.Load() {
			ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, ""), time.Now().Add(writeWait))
		}
		return nil
	})
	if u.Readers != nil {
		u.Readers.Go(c.read)
	} else {
		go c.read()
	}
	return c, nil
}

// NotJSON is the Type of a frame that was no JSON text frame, which the
// gateway never sends.
const NotJSON = "(not json)"

// Frame is a frame the gateway sent, as a client reads it.
type Frame struct {
	Type       string `json:"type"`
	TTLMS      int64  `json:"ttl_ms"`
	ID         string `json:"id"`
	Text       string `json:"text"`
	Code       string `json:"code"`
	DeadlineMS int64  `json:"deadline_ms"`
	Stage      int    `json:"stage"`
	Final      bool   `json:"final"`
	// At is when the frame arrived.
	At time.Time `json:"-"`
}

func (f Frame) String() string {
	if f.Type != frame.TypeGuide {
		return fmt.Sprintf("%s %s at %s", f.Type, f.Code, f.At.Format(time.StampMilli))
	}
	return fmt.Sprintf("guide %s stage %d for deadline %s at %s", f.ID, f.Stage,
		time.UnixMilli(f.DeadlineMS).Format(time.StampMilli), f.At.Format(time.StampMilli))
}

// Answer is a ping's answer: a pong, or "session store unavailable".
type Answer struct {
	// Sent is when the ping was sent, At when its answer arrived.
	Sent, At time.Time
	// TTL is the pong's grant; zero when Unavailable.
	TTL time.Duration
	// Deadline is the deadline the pong named (Redis's clock); zero when
	// it named none, or Unavailable.
	Deadline    time.Time
	Unavailable bool
}

// Low is the earliest the deadline the pong proves can be: Redis renewed
// the session after the ping was sent, for TTL. Never later than
// Redis's deadline.
func (a Answer) Low() time.Time { return a.Sent.Add(a.TTL) }

// High is the latest it can be: the renewal came before the pong.
func (a Answer) High() time.Time { return a.At.Add(a.TTL) }

// ping is a ping sent and not answered yet.
type ping struct {
	sent   time.Time
	answer chan Answer // buffered: the reader never waits for a pinger that gave up
}

// Conn is one connection of a user. read, on a goroutine of its own, is
// the only reader; writes take wmu.
type Conn struct {
	u    *User
	ws   *websocket.Conn
	gone chan struct{} // closed when the read side ends

	wmu    sync.Mutex // serializes writes
	frozen atomic.Bool

	mu      sync.Mutex
	pending []ping  // pings not answered yet, oldest first
	frames  []Frame // every frame that answered no ping, in order
	next    int     // the first of frames that Next has not returned
	more    chan struct{}
	err     error // what ended the read side
	goneAt  time.Time
}

// Ping sends a ping; its answer is recorded when it comes. timed says the
// caller's period timer sent it (and not a connect), so that one sent
// past High counts as LateSelf.
func (c *Conn) Ping(timed bool) error {
	_, err := c.ping(timed)
	return err
}

// PingAnswer sends a ping and returns where its answer will come: the
// caller waits as long as it likes, and a late answer still comes there
// (and to the record) unless the connection ends first.
func (c *Conn) PingAnswer() (<-chan Answer, error) { return c.ping(false) }

// PingWait sends a ping and waits, within at most, for its answer. It
// fails with ErrGone if the connection ended first, or ErrNoAnswer; a
// ping given up on stays in line, so that its late answer is not taken
// for the next one's.
func (c *Conn) PingWait(within time.Duration) (Answer, error) {
	answer, err := c.ping(false)
	if err != nil {
		return Answer{}, err
	}
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case a := <-answer:
		return a, nil
	case <-c.gone:
		// An answer read just before the end still counts.
		select {
		case a := <-answer:
			return a, nil
		default:
			return Answer{}, fmt.Errorf("%w: %v", ErrGone, c.Err())
		}
	case <-timer.C:
		return Answer{}, ErrNoAnswer
	}
}

func (c *Conn) ping(timed bool) (<-chan Answer, error) {
	now := time.Now()
	p := ping{sent: now, answer: make(chan Answer, 1)}
	// In line before the write, so that the reader finds it whenever the
	// answer comes.
	c.mu.Lock()
	c.pending = append(c.pending, p)
	c.mu.Unlock()
	u := c.u
	u.mu.Lock()
	if timed {
		switch {
		case !u.toldSent.IsZero():
			if u.toldSent.Equal(u.rec.LastPing) && now.After(u.told) {
				u.rec.LateSelf++
				u.rec.Missed = append(u.rec.Missed, u.told)
			}
		case !u.rec.High.IsZero() && now.After(u.rec.High):
			u.rec.LateSelf++
		}
	}
	u.rec.Pings++
	u.rec.LastPing = now
	u.rec.High = later(u.rec.High, now.Add(u.TTL+u.Jitter))
	u.mu.Unlock()
	return p.answer, c.WriteRaw(websocket.TextMessage, []byte(`{"type":"ping"}`))
}

// Ack acknowledges the guide id. It is no activity: the session is not
// renewed.
func (c *Conn) Ack(id string) error {
	b, err := json.Marshal(frame.Client{Type: frame.TypeAck, ID: id})
	if err != nil {
		return err
	}
	return c.WriteRaw(websocket.TextMessage, b)
}

// Auth hands the connection a fresh token (an auth frame), before the
// one it was opened with runs out. Its answer (auth_ok, or an error
// frame) comes as any other frame, from Next.
func (c *Conn) Auth(tok string) error {
	b, err := json.Marshal(frame.Client{Type: frame.TypeAuth, Token: tok})
	if err != nil {
		return err
	}
	return c.WriteRaw(websocket.TextMessage, b)
}

// WriteRaw sends one message of kind (websocket.TextMessage or
// BinaryMessage) as it is, for tests of the protocol's edges. A ping sent
// this way is not waited for: its answer is kept as any other frame.
func (c *Conn) WriteRaw(kind int, data []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.ws.SetWriteDeadline(time.Now().Add(writeWait))
	return c.ws.WriteMessage(kind, data)
}

// Next returns the next frame that answered no ping (a guide, an error
// frame), waiting within at most for one. It fails with what ended the
// connection once every frame before the end was returned, or with
// ErrNoAnswer.
func (c *Conn) Next(within time.Duration) (Frame, error) {
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		c.mu.Lock()
		if c.next < len(c.frames) {
			f := c.frames[c.next]
			c.next++
			c.mu.Unlock()
			return f, nil
		}
		more := c.more
		c.mu.Unlock()
		select {
		case <-more:
		case <-c.gone:
			c.mu.Lock()
			left := c.next < len(c.frames)
			c.mu.Unlock()
			if !left {
				return Frame{}, c.Err()
			}
		case <-timer.C:
			return Frame{}, ErrNoAnswer
		}
	}
}

// Guides returns every guide the connection showed so far, Next or not.
func (c *Conn) Guides() []Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	var gs []Frame
	for _, f := range c.frames {
		if f.Type == frame.TypeGuide {
			gs = append(gs, f)
		}
	}
	return gs
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

// Err is what ended the read side (a *websocket.CloseError when the
// gateway closed it), or nil while it lasts.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// GoneAt is when the read side ended; zero while it lasts.
func (c *Conn) GoneAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.goneAt
}

// CloseCode is the code of the close frame that ended the connection, or
// 0 when none did (or it lasts).
func (c *Conn) CloseCode() int {
	var ce *websocket.CloseError
	if errors.As(c.Err(), &ce) {
		return ce.Code
	}
	return 0
}

// Freeze makes the connection answer nothing from then on, as an app
// that hangs: neither the gateway's protocol pings nor its close frame.
// Frames are still kept as they come; the read side ends when the gateway
// closes.
func (c *Conn) Freeze() { c.frozen.Store(true) }

// Close closes the connection at once, without a close frame.
func (c *Conn) Close() error { return c.ws.Close() }

// Leave closes the connection normally: a close frame with 1000, as a
// user who leaves the chat sends. It waits within at most for the
// gateway's answering close, then closes; zero closes at once. It reports
// the gateway's answer: nil for a 1000, else what ended the connection,
// or ErrNoAnswer.
func (c *Conn) Leave(within time.Duration) error {
	defer c.ws.Close()
	msg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye")
	if err := c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(writeWait)); err != nil {
		return err
	}
	if within <= 0 {
		return nil
	}
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case <-c.gone:
		if err := c.Err(); !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
			return err
		}
		return nil
	case <-timer.C:
		return ErrNoAnswer
	}
}

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

// read takes the gateway's frames. The gateway answers a connection's
// pings in order, each with a pong or an error, so the oldest ping
// pending is the one answered.
func (c *Conn) read() {
	u := c.u
	for {
		kind, b, err := c.ws.ReadMessage()
		at := time.Now()
		if err != nil {
			c.mu.Lock()
			c.err, c.goneAt = err, at
			c.mu.Unlock()
			close(c.gone)
			return
		}
		f := Frame{At: at}
		if kind != websocket.TextMessage || json.Unmarshal(b, &f) != nil {
			f = Frame{Type: NotJSON, At: at}
		}
		unavailable := f.Type == frame.TypeError && f.Code == frame.CodeUnavailable
		if f.Type == frame.TypePong || unavailable {
			if p, ok := c.answered(); ok {
				a := Answer{Sent: p.sent, At: at, Unavailable: unavailable}
				u.mu.Lock()
				if unavailable {
					u.rec.Unavailable++
					if u.UnavailableGrants {
						u.rec.Low = later(u.rec.Low, p.sent.Add(u.TTL))
					}
				} else {
					a.TTL = time.Duration(f.TTLMS) * time.Millisecond
					if f.DeadlineMS > 0 {
						a.Deadline = time.UnixMilli(f.DeadlineMS)
					}
					u.rec.Pongs++
					u.rec.Low = later(u.rec.Low, a.Low())
					u.rec.High = later(u.rec.High, a.High())
					if f.DeadlineMS > 0 && !p.sent.Before(u.toldSent) {
						u.told, u.toldSent = time.UnixMilli(f.DeadlineMS), p.sent
					}
				}
				u.mu.Unlock()
				p.answer <- a
				continue
			}
		}
		if f.Type == frame.TypeGuide {
			u.mu.Lock()
			u.rec.Guides++
			u.mu.Unlock()
		}
		c.mu.Lock()
		c.frames = append(c.frames, f)
		close(c.more)
		c.more = make(chan struct{})
		c.mu.Unlock()
	}
}

func (c *Conn) answered() (ping, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return ping{}, false
	}
	p := c.pending[0]
	c.pending = c.pending[1:]
	return p, true
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
