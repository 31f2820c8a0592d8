package gateway

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/wsread"
)

// conn is one client connection. Invariant, as gorilla/websocket requires:
// exactly one reader at a time (a reader drives it: Message for each
// message, one call at a time, then Closed once; see read.go) and at most
// one writer of data frames (a flusher, started by enqueue only while
// frames wait, so an idle connection costs no writer goroutine). Control
// frames (close frames, the gateway's protocol pings) go out through
// WriteControl, which is safe beside both. Nothing is written once the
// flusher has stopped after Closed.
//
// An idle connection is mostly this struct (128 bytes; TestConnFootprint
// measures the whole of a connection's own heap), so it holds only what
// a connection needs and keeps the rest elsewhere: its logger is the
// gateway's (the uid is a field at each call), its token's expiry is on
// the gateway's one timer (see auth.go), its user's place is shared with
// its user's other connections and found by uid (see user.go), and what
// only some connections need is made on the first need (see extra). The
// fields are ordered so that none pads.
type conn struct {
	g    *Gateway
	ws   *websocket.Conn
	next *conn // the user's next connection here; the hub shard's lock
	// x is what only some connections need (see extra); nil until then.
	// Guarded by mu.
	x *extra

	uid, segment string

	// pingAt and grant are the last ping that asked for a renewal: when it
	// came, in ns since the gateway started (a monotonic clock), and the
	// TTL in ns it was granted, or would have been: grant is negative
	// until the renewal is written, so also when it failed, and 0 before
	// the first ping and once the user ended the session. A ping writes
	// them, grant first; the resync loop reads them, pingAt first, so it
	// never pairs a ping with the grant of an earlier one. A renewal's
	// outcome only turns the sign of its own grant (see written). Before
	// the first ping, pingAt is when c registered with its user (hub.add):
	// what a renewal must be newer than to be shared (see renew).
	pingAt, grant atomic.Int64
	// rateAt is the frame rate limit's state (see allowFrame): Message's
	// own.
	rateAt time.Duration
	// heard is when the client was last heard from (a message, or a pong
	// that moved the read deadline), in ns since the gateway started; at
	// first when c registered with its user. pingAll pings only a
	// connection not heard from for a while.
	heard atomic.Int64

	mu sync.Mutex
	// queue is the frames waiting for the flusher, queued of them; bounded,
	// see enqueue.
	queue  frameRing
	queued uint32
	// flags are the connection's flags, in one word.
	flags atomic.Uint32

	// expiresSec is when the connection's token expires (Unix seconds, as
	// a token says; until 2106); an auth frame with a fresh token moves it
	// later. expiryAt is c's place on the gateway's token timer. See
	// auth.go.
	expiresSec atomic.Uint32
	expiryAt   int32
	// openedMS is when the connection opened, Unix ms by Redis's clock
	// as this instance reads it: a close applied on another device at or
	// after it is this device's to be told (see takeInbox).
	openedMS int64
	// rd is the connection as the reader reads it (see read.go).
	rd *wsread.Conn
}

// A connection's flags. Those after flagRevoked change under mu only.
const (
	// flagInactive: the guide of a close stage was written, and the
	// connection is being closed with 4000; nothing is read or written
	// on it any more (see inactive.go).
	flagInactive uint32 = 1 << iota
	// flagRevoked: the token expired and the connection is being closed
	// (see auth.go).
	flagRevoked
	// flagFlushing: a flusher is running.
	flagFlushing
	// flagClosed: reading ended, or a write failed: enqueue refuses.
	flagClosed
	// flagCloseSet: the gateway closes the connection; enqueue refuses
	// from then on (nothing is written after a close frame), later closes
	// are dropped, and a close the client answers with is not its own.
	flagCloseSet
	// flagFinished: finish is over.
	flagFinished
)

func (c *conn) is(f uint32) bool { return c.flags.Load()&f != 0 }

// set sets f and reports whether it was set first here.
func (c *conn) set(f uint32) bool { return c.flags.Or(f)&f == 0 }

func (c *conn) unset(f uint32) { c.flags.And(^f) }

func (c *conn) inactive() bool { return c.is(flagInactive) }
func (c *conn) revoked() bool  { return c.is(flagRevoked) }

// extra is what only some connections need, made on the first need and
// kept: a connection that idles, most of them most of the time, holds
// none of it. Guarded by the connection's mu.
type extra struct {
	// hold is the hold of a connection that asked to ping first (see
	// present.go) while it lasts, else nil; set before the connection is
	// served, and dropped once over.
	hold *hold
	// unproven are the guide frames queued and not yet proven received,
	// in the order queued (proofSeq numbers them); guideIDs the ids of
	// the last guides queued, which a pushed copy does not repeat. See
	// proof.go.
	unproven []*guideProof
	proofSeq uint64
	guideIDs []string
	// acked has bit i set once a device acknowledged guideIDs[i]: a
	// repeated ack is not recorded in the user's timeline again. proven
	// has it set once the client proved it got guideIDs[i]; there once
	// it was sent as an inbox copy while its live copy may still come
	// (see guideProof.there).
	acked, proven, there uint8
	// fin is closed once the connection has finished (see finish), for
	// whoever waits for that (an inbox handover); flushed once the
	// flusher running has stopped (for finish). Each is made by its
	// first waiter.
	fin, flushed chan struct{}
	// closedAt, when not 0, is when the connection closed normally (since
	// the gateway started): the client closed with 1000, the user leaving
	// on purpose, or the gateway closed with 4000 after a close stage's
	// guide (see inactive.go). release ends the session if this was their
	// last connection anywhere, as of then.
	closedAt time.Duration
	// closeCode is the code of the gateway's close of the connection,
	// once it closes it (flagCloseSet): for the user's timeline.
	closeCode int
	// presentUntilMS is when, by its client's word, its user's session
	// would have run out had they reached us (Unix ms, Redis's clock; 0:
	// no word): a guide of a silence that ran out before it is dropped.
	presentUntilMS int64
}

// more returns c's extra, made if need be. c.mu is held.
func (c *conn) more() *extra {
	if c.x == nil {
		c.x = &extra{}
	}
	return c.x
}

// presentUntil is c's presentUntilMS.
func (c *conn) presentUntil() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.x == nil {
		return 0
	}
	return c.x.presentUntilMS
}

// setPresentUntil records what the inbox knew of c's client's word.
func (c *conn) setPresentUntil(ms int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.more().presentUntilMS = ms
}

// prepare sets c up to be read: its limits, and the deadlines its pongs
// move. It runs before the reader starts.
func (c *conn) prepare() {
	c.ws.SetReadLimit(int64(c.g.cfg.ReadLimit))
	c.hear()
	if c.revoked() || c.inactive() {
		// Closed while being set up (a guide pushed, a token run out):
		// the linger deadline that close set stands. Checked after the
		// deadline above, so that either order ends with the linger.
		c.ws.SetReadDeadline(time.Now().Add(c.closingLinger()))
	}
	c.ws.SetPongHandler(c.pong)
}

// pong takes a pong: the proof of guides written before its ping, and a
// sign of life that keeps the read deadline moving.
func (c *conn) pong(appData string) error {
	proved := c.pongProof(appData)
	if c.revoked() || c.inactive() {
		if proved && c.inactive() && !c.awaitingProof() {
			// The close stage's guide is proven: the plain linger
			// is left of the wait for it.
			return c.ws.SetReadDeadline(time.Now().Add(lingerTimeout))
		}
		return nil // the linger deadline stands
	}
	_, err := c.hear()
	return err
}

// hear records that the client was heard from now: heard, and the read
// deadline an idle timeout from now, together, so that pingAll's quiet
// connections are those the deadline is about to end. It returns now,
// since the gateway started.
func (c *conn) hear() (time.Duration, error) {
	now := time.Since(c.g.start)
	c.heard.Store(int64(now))
	return now, c.ws.SetReadDeadline(time.Now().Add(c.g.cfg.IdleTimeout))
}

// Message answers one client message and reports whether the connection
// is read on. It never waits: on an event loop it runs on a worker every
// connection shares. What takes a Redis round trip is done after it
// returns (a renewal, see renew), or on a goroutine of its own (a hold's
// end, see present.go).
func (c *conn) Message(typ int, data []byte) bool {
	if c.inactive() {
		// Closed for inactivity: nothing the client sends now is taken,
		// above all no ping, which would renew the session that ended;
		// but an ack of the close stage's guide proves it got there. Until
		// it is proven, frames are read on, not discarded: a pong to the
		// ping after the guide may come after this frame (closingLinger
		// bounds the wait).
		c.ackProofOf(typ, data)
		if c.awaitingProof() {
			return true
		}
		c.linger()
		return false
	}
	if c.revoked() || c.tokenExpired() {
		// Nothing a client sends after its token expired is taken, above
		// all no ping: it would renew a session nobody vouches for.
		c.expire()
		c.linger()
		return false
	}
	now, _ := c.hear()
	var ok bool
	if c.rateAt, ok = allowFrame(c.rateAt, now, c.g.frameInterval, c.g.cfg.RateBurst); !ok {
		metricRateLimited.Inc()
		c.closeWith(websocket.ClosePolicyViolation, "rate limit exceeded")
		c.linger()
		return false
	}
	if typ != websocket.TextMessage {
		metricFrames.WithLabelValues("binary").Inc()
		c.closeWith(websocket.CloseUnsupportedData, "binary frames are not supported")
		c.linger()
		return false
	}
	f, err := frame.Parse(data)
	if err != nil {
		metricFrames.WithLabelValues("invalid").Inc()
		c.closeWith(websocket.CloseInvalidFramePayloadData, "frame is not a JSON object")
		c.linger()
		return false
	}
	// The first frame ends a hold, before it is answered: the inbox is
	// judged by its word, not by its renewal. Frames that come while the
	// hold ends are answered once it has, in order.
	if !c.afterHold(f) {
		c.answer(f)
	}
	return true
}

// allowFrame decides whether a frame at now passes the rate limit, a
// bucket of burst frames refilling one per interval, and returns the
// bucket's state after it: at is when the bucket would be full again
// (times since the gateway started). An idle connection's at is in the
// past, its bucket full. One field per connection, where a limiter of
// its own took 80 bytes.
func allowFrame(at, now, interval time.Duration, burst int) (time.Duration, bool) {
	at = max(at, now)
	if at-now > time.Duration(burst-1)*interval {
		return at, false
	}
	return at + interval, true
}

// answer answers a frame that parsed. It does not wait.
func (c *conn) answer(f frame.Client) {
	if err := f.Validate(); err != nil {
		if frame.IsUnknownType(err) {
			metricFrames.WithLabelValues("unknown").Inc()
			c.enqueue(frame.Error(frame.CodeUnknownType, "unknown frame type"))
		} else {
			metricFrames.WithLabelValues("invalid").Inc()
			c.enqueue(frame.Error(frame.CodeBadFrame, err.Error()))
		}
		return
	}
	metricFrames.WithLabelValues(f.Type).Inc()
	switch f.Type {
	case frame.TypePing:
		c.renew()
	case frame.TypeAck:
		// Proof of receipt only: an ack must not renew the session, or a
		// client that acks automatically would be guided every TTL.
		c.g.log.Debug("guide acknowledged", "uid", c.uid, "guide_id", f.ID)
		if c.ackProof(f.ID) {
			c.g.timeline.Record(c.uid, ackedEntry(f.ID))
		}
	case frame.TypeAuth:
		// Not activity either: a tab that refreshes its token while
		// nobody is at it is a silent user.
		c.refresh(f.Token)
	}
}

// renew grants the session TTL plus jitter and answers with a pong once
// the renewal is written, without waiting for it: the answer is queued
// from the renewer's goroutine. A ping within the renewal granularity of
// the last renewal among the user's connections here, in its segment,
// shares it (see user.go), and is answered once that is written. A
// connection's answers keep the order of its pings: a renewal is
// answered on its own connection before its sharers are, and the renewer
// settles renewals in the order asked.
func (c *conn) renew() {
	start := time.Now()
	now := start.Sub(c.g.start)
	p := c.g.policy.Current()
	ttl := grantTTL(p, c.segment)
	u, mu := c.g.hub.userOf(c.uid)
	rs := &u.renewals
	// A renewal older than this connection's registration is not shared
	// (see shareRenewal), nor one older than its last ping's: the user's
	// last renewal is no older than that, but for pings of two devices
	// that cross, which then renew each.
	since := time.Duration(c.pingAt.Load())
	r, own := rs.claim(mu, c.segment, since, now, c.g.cfg.RenewGranularity, ttl)
	// Recorded before the renewal, so that a resync after an outage
	// restores it even if it fails. A shared one is the connection's own
	// too: its grant is what this connection stands for in a resync, or
	// among the dropped grants, should the one that renewed go first.
	c.grant.Store(-int64(r.ttl()))
	c.pingAt.Store(int64(r.at))
	if !own {
		// Bounded by the write timeout of the ping that renews it.
		rs.whenSettled(mu, r, func() {
			if r.failed() {
				c.enqueue(frame.Error(frame.CodeUnavailable, "session store unavailable, ping again"))
				return
			}
			metricRenewalsCoalesced.Inc()
			c.written(r.ttl())
			c.enqueue(frame.Pong((r.ttl() - (now - r.at)).Milliseconds(), r.deadlineMS))
		})
		return
	}
	// Not cut short by the gateway's shutdown: a ping that arrived while
	// draining is still a renewal the user is owed. Bounded by the
	// renewer: its round trip's timeout, or its queue's wait (the write
	// timeout).
	c.g.renewer.RenewAsync(c.uid, c.segment, ttl, p.Clock(c.segment), func(deadline time.Time, err error) {
		metricRenewalSeconds.Observe(time.Since(start).Seconds())
		if err != nil {
			metricRenewals.WithLabelValues("error").Inc()
			c.g.renewLog.Fail(err)
			// The connection stays; the client's next ping retries.
			c.enqueue(frame.Error(frame.CodeUnavailable, "session store unavailable, ping again"))
		} else {
			c.g.renewLog.OK()
			metricRenewals.WithLabelValues("ok").Inc()
			c.written(ttl)
			// The pong tells this connection's own grant, not the
			// session's deadline, which another device of the user (a
			// segment with a longer TTL) may hold later: the client paces
			// its pings by it, and must keep its own session alive once
			// that other grant has run out. The deadline it counts from
			// it is never later than Redis's; deadline is this grant's
			// own, Redis's now plus ttl (see Renewer.Renew).
			c.enqueue(frame.Pong(ttl.Milliseconds(), deadline.UnixMilli()))
		}
		// After its own answer, so that a later ping of this connection
		// that shares it is answered after it.
		rs.settle(mu, r, time.Since(c.g.start), deadline, err)
	})
}

// grantTTL is the TTL a renewal in segment grants under p: the
// segment's TTL plus a uniform jitter in [0, p.Jitter), so that expiries
// don't clump, in whole milliseconds. A ping's renewal and the platform's
// activity (see activity.go) grant the same.
func grantTTL(p policy.Policy, segment string) time.Duration {
	return (p.TTL(segment) + grantJitter(p)).Truncate(time.Millisecond)
}

// grantJitter is a grant's jitter under p, uniform in [0, p.Jitter).
func grantJitter(p policy.Policy) time.Duration {
	if p.Jitter > 0 {
		return rand.N(p.Jitter)
	}
	return 0
}

// written records that the renewal granting ttl was written, if it is
// still the connection's last: a later ping's grant, or a normal close
// (0), is left as it is.
func (c *conn) written(ttl time.Duration) {
	c.grant.CompareAndSwap(-int64(ttl), int64(ttl))
}

// lastGrant is what is left, at now (since the gateway started), of the
// last grant: the deadline the last ping was given, or would have been
// had Redis been in reach; Left is zero or less once it ran out. ok is
// false when nothing was granted.
func (c *conn) lastGrant(now time.Duration) (g session.Grant, ok bool) {
	at := time.Duration(c.pingAt.Load())
	ttl := time.Duration(c.grant.Load())
	if ttl == 0 {
		return session.Grant{}, false
	}
	return session.Grant{UID: c.uid, Segment: c.segment, Left: ttl.Abs() - (now - at), Ago: now - at}, true
}

// endAt is when c closed normally, since the gateway started, or 0.
func (c *conn) endAt() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.x == nil {
		return 0
	}
	return c.x.closedAt
}

// Closed ends c once reading has: err is why (see read.go). It does not
// wait: what waits (the flusher's last write, a hold's end) and what
// writes to Redis (the route, the guides handed on) runs on a goroutine of
// its own, which takes over the connection's count in g.conns, so that
// the drain waits for it, and its slot in g.open.
func (c *conn) Closed(err error) {
	c.ended(err)
	code, ours := c.endCode(err)
	c.stop()
	go func() {
		defer c.g.conns.Done()
		defer c.g.open.Add(-1)
		// A connection's bookkeeping outlives the gateway's shutdown,
		// which waits for it (see drain).
		ctx := context.Background()
		c.finish(ctx)
		if c.normalClose() {
			c.leaveAfterRenewals()
		}
		c.g.release(ctx, c, code, ours)
	}()
}

// endCode is the close code c ended with, for the user's timeline: the
// gateway's, when it closed c (ours), else the client's (err is the
// reader's), 1009 for a frame past the read limit, or 1006 (abnormal)
// when no close frame came.
func (c *conn) endCode(err error) (code int, ours bool) {
	c.mu.Lock()
	if c.is(flagCloseSet) && c.x != nil && c.x.closeCode != 0 {
		code = c.x.closeCode
	}
	c.mu.Unlock()
	if code != 0 {
		return code, true
	}
	var ce *websocket.CloseError
	switch {
	case errors.As(err, &ce):
		return ce.Code, false
	case errors.Is(err, websocket.ErrReadLimit):
		return websocket.CloseMessageTooBig, true
	}
	return websocket.CloseAbnormalClosure, false
}

// leaveAfterRenewals dates a normal close no earlier than the renewals of
// the user's pings read before it: they are written after Message
// returned, from the renewer, and may land after the close was read. One
// that Redis runs after the end would write back the session the user
// ended, and one run before it, but at a Redis time later than the close,
// makes the end stand down (a renewal newer than the close, see
// session.RouteCount): either way the silence of a user who left would be
// guided. So release waits for the user's last renewal here (the renewer
// settles them in the order asked, so the earlier ones too), and the
// close counts from its reply if that came later. It runs after finish:
// a hold's end has answered the pings it held.
func (c *conn) leaveAfterRenewals() {
	u, mu := c.g.hub.userOf(c.uid)
	if u == nil {
		return
	}
	mu.Lock()
	r := u.renewals.last
	mu.Unlock()
	if r == nil {
		return
	}
	settled := make(chan struct{})
	u.renewals.whenSettled(mu, r, func() { close(settled) })
	<-settled
	c.mu.Lock()
	c.x.closedAt = max(c.x.closedAt, r.settledAt())
	c.mu.Unlock()
}

// stop refuses every frame from now on, takes c off the token timer, and
// closes the socket, so that a flusher blocked in a write fails at once.
// It does not wait.
func (c *conn) stop() {
	c.mu.Lock()
	c.set(flagClosed)
	c.mu.Unlock()
	c.stopExpiry()
	c.ws.Close()
}

// finish ends c once nothing reads it any more and stop has run: no frame
// is queued or written after it, and fin tells whoever waits for c's
// proofs (an inbox handover, see push.go) that none will come. Closed
// runs it; serveWS, for a connection the drain turned away before it was
// read. A connection that does not run it leaves its handovers waiting
// for good, and with them the drain, which waits for every goroutine of a
// connection.
func (c *conn) finish(ctx context.Context) {
	c.waitFlushed()
	// A hold still on ends here: what it held goes back to the inbox.
	c.g.endHold(ctx, c, noPresence)
	c.mu.Lock()
	c.set(flagFinished)
	if c.x != nil && c.x.fin != nil {
		close(c.x.fin)
	}
	c.mu.Unlock()
}

// finishedCh returns a channel closed once c has finished. It is made on
// the first ask: a connection nobody waits on holds none.
func (c *conn) finishedCh() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	x := c.more()
	if x.fin == nil {
		x.fin = make(chan struct{})
		if c.is(flagFinished) {
			close(x.fin)
		}
	}
	return x.fin
}

// waitFlushed returns once no flusher runs, c's flusher having seen c
// closed, or c's close frame being the last queued: none starts again.
func (c *conn) waitFlushed() {
	c.mu.Lock()
	if !c.is(flagFlushing) {
		c.mu.Unlock()
		return
	}
	x := c.more()
	if x.flushed == nil {
		x.flushed = make(chan struct{})
	}
	flushed := x.flushed
	c.mu.Unlock()
	<-flushed
}

// normalClose reports whether c closed normally (see extra.closedAt).
func (c *conn) normalClose() bool { return c.endAt() != 0 }

// closeNormally records c's normal close. Marked first, so that a resync
// does not restore the session; one that read the grant before is caught
// after (see resyncConns).
func (c *conn) closeNormally() {
	c.mu.Lock()
	c.more().closedAt = max(time.Since(c.g.start), 1)
	c.mu.Unlock()
	c.grant.Store(0)
}

// ended handles the end of the read side: err is the reader's (nil after
// Message stopped reading). A normal close (1000) is the user leaving on
// purpose: unless they are still connected elsewhere, the session goes
// and no guide follows (release does it, with the route write that counts
// this connection out). Any other end leaves the session to run out.
func (c *conn) ended(err error) {
	if err == nil {
		return // Message ended it, and said why
	}
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		if errors.Is(err, websocket.ErrReadLimit) {
			// gorilla/websocket has sent the 1009 close frame, and the
			// reader lingered.
			metricCloses.WithLabelValues(strconv.Itoa(websocket.CloseMessageTooBig)).Inc()
			return
		}
		metricCloses.WithLabelValues("abnormal").Inc()
		return
	}
	metricCloses.WithLabelValues(strconv.Itoa(ce.Code)).Inc()
	if ce.Code != websocket.CloseNormalClosure {
		return
	}
	c.mu.Lock()
	ours := c.is(flagCloseSet)
	c.mu.Unlock()
	if ours {
		// A 1000 in answer to the gateway's own close (4001, 1001, ...):
		// RFC 6455 only says a client "typically" echoes the code, and
		// many answer 1000 whatever they got. The user did not leave.
		return
	}
	c.closeNormally()
}

// closeWith sends a close frame with code and reason, once, after the
// frames already queued, from a flusher: the caller does not wait for
// the socket, which a client that does not read can fill.
func (c *conn) closeWith(code int, reason string) { c.closeFrame(code, reason, false) }

// closeNow is closeWith, but writes the frame on the caller's goroutine
// when no flusher runs (bounded by the write timeout): for the drain and
// the shed, which bound how many they write at once instead of starting
// a goroutine for each connection.
func (c *conn) closeNow(code int, reason string) { c.closeFrame(code, reason, true) }

func (c *conn) closeFrame(code int, reason string, here bool) {
	msg := websocket.FormatCloseMessage(code, reason)
	c.mu.Lock()
	if !c.set(flagCloseSet) {
		c.mu.Unlock()
		return
	}
	c.more().closeCode = code
	metricCloses.WithLabelValues(strconv.Itoa(code)).Inc()
	if c.is(flagClosed) {
		c.mu.Unlock()
		return // the socket is closed: nothing goes out any more
	}
	if c.is(flagFlushing) || !here {
		c.queue.push(outFrame{b: msg, close: true})
		c.queued++
		c.startFlusher()
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(c.g.cfg.WriteTimeout))
}

// ping sends a protocol-level ping, which the client answers with a pong
// that keeps the read deadline moving.
func (c *conn) ping() {
	if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.g.cfg.WriteTimeout)); err != nil {
		c.ws.NetConn().Close() // the reader fails at once, and Closed cleans up
	}
}

// linger asks the reader, once Message returns false, to wait briefly
// for the client to read our close frame and hang up, discarding what it
// still sends: closing the socket with unread input would reset the
// connection, and the client could lose the close code.
func (c *conn) linger() { c.rd.Linger(lingerTimeout) }

// lingerTimeout bounds linger.
const lingerTimeout = time.Second

// closingLinger is how long a connection the gateway closed is read
// after its close frame: the linger, or after a close stage's guide not
// yet proven, the wait for its proof (whose timer cuts the connection
// off at its end, and whose pong starts the plain linger).
func (c *conn) closingLinger() time.Duration {
	if c.inactive() && c.awaitingProof() {
		return max(lingerTimeout, c.g.cfg.WriteTimeout)
	}
	return lingerTimeout
}

// outFrame is a frame waiting to be written, what to call once it is on
// the socket, and for a guide, its wait for proof (see proof.go). A close
// frame (close) is the last: nothing is queued after it. A silent one
// writes nothing: its calls come in their turn, after the frames queued
// before it (see closesAfterCopy).
type outFrame struct {
	b       []byte
	written func()
	proof   *guideProof
	close   bool
	silent  bool
}

// frameRing is a queue of frames, oldest first, as a ring of nodes held
// by its newest: one word on an idle connection, where a slice held three.
type frameRing struct{ last *frameNode }

type frameNode struct {
	outFrame
	next *frameNode
}

func (q *frameRing) push(f outFrame) {
	n := &frameNode{outFrame: f}
	if q.last == nil {
		n.next = n
	} else {
		n.next, q.last.next = q.last.next, n
	}
	q.last = n
}

// take empties q and returns its frames, oldest first, as a list that
// ends in nil.
func (q *frameRing) take() *frameNode {
	if q.last == nil {
		return nil
	}
	first := q.last.next
	q.last.next, q.last = nil, nil
	return first
}

// dropQueue drops the frames queued. c.mu is held.
func (c *conn) dropQueue() {
	c.queue.take()
	c.queued = 0
}

// enqueue queues a frame for the client without blocking, starting a
// flusher if none runs. A client whose queue is full is not reading: it is
// cut off so it cannot hold up the sender.
func (c *conn) enqueue(b []byte) bool { return c.enqueueThen(b, nil) }

// enqueueThen is enqueue, and calls written, on the flusher's goroutine,
// once the frame is written to the socket. written must not block.
func (c *conn) enqueueThen(b []byte, written func()) bool {
	return c.enqueueFrame(outFrame{b: b, written: written})
}

// enqueueFrame is enqueue's body. A guide's proof waits from here on.
func (c *conn) enqueueFrame(f outFrame) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.is(flagClosed | flagCloseSet) {
		return false
	}
	if f.proof != nil && c.hasGuide(f.proof) {
		proven := f.proof.proven != nil && c.provenHere(f.proof.id)
		if proven {
			// Proven here before: this copy is too (a copy kept ahead
			// again on its way on leaves the inbox, see ahead.go).
			// proven does not block.
			f.proof.proven()
		}
		if !c.closesAfterCopy(f) {
			return true
		}
		// The guide is not written again; its close is applied once
		// the copy before it is written, and waits for proof as the
		// live copy would have (unproven, it is kept closed).
		f.b, f.silent = nil, true
		if proven {
			f.proof = nil
		}
	}
	if int(c.queued) >= c.g.cfg.SendQueue {
		c.set(flagClosed)
		metricSlowClients.Inc()
		c.g.log.Info("send queue full, closing slow client", "uid", c.uid)
		c.ws.NetConn().Close() // the reader fails at once, and Closed cleans up
		return false
	}
	c.queue.push(f)
	c.queued++
	if f.proof != nil {
		c.awaitingFrom(f.proof)
	}
	c.startFlusher()
	return true
}

// startFlusher starts a flusher unless one runs. c.mu is held.
func (c *conn) startFlusher() {
	if c.set(flagFlushing) {
		go c.flush()
	}
}

// flushStopped marks the flusher stopped, for whoever waits for it. c.mu
// is held.
func (c *conn) flushStopped() {
	c.unset(flagFlushing)
	if c.x != nil && c.x.flushed != nil {
		close(c.x.flushed)
		c.x.flushed = nil
	}
}

// flush writes queued frames until the queue is empty, then exits.
func (c *conn) flush() {
	for {
		c.mu.Lock()
		batch := c.queue.take()
		c.queued = 0
		if batch == nil || c.is(flagClosed) {
			c.flushStopped()
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		for ; batch != nil; batch = batch.next {
			f := &batch.outFrame
			deadline := time.Now().Add(c.g.cfg.WriteTimeout)
			var err error
			switch {
			case f.silent:
			case f.close:
				err = c.ws.WriteControl(websocket.CloseMessage, f.b, deadline)
			default:
				c.ws.SetWriteDeadline(deadline)
				err = c.ws.WriteMessage(websocket.TextMessage, f.b)
			}
			if err != nil {
				c.mu.Lock()
				c.set(flagClosed)
				c.dropQueue()
				c.flushStopped()
				c.mu.Unlock()
				c.ws.NetConn().Close()
				return
			}
			if f.proof != nil {
				c.awaitProof(f.proof)
			}
			if f.written != nil {
				f.written()
				if c.inactive() {
					// The frame ended the connection (closeInactive):
					// nothing goes out after its close frame.
					c.mu.Lock()
					c.dropQueue()
					c.flushStopped()
					c.mu.Unlock()
					return
				}
			}
		}
	}
}
