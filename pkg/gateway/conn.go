package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/time/rate"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/session"
)

// conn is one client connection. Invariant, as gorilla/websocket requires:
// exactly one goroutine reads (serve, on a goroutine serveWS starts) and
// at most one writes data frames (a flusher, started by enqueue only while
// frames wait, so an idle connection costs no writer goroutine). Control
// frames (close, and the gateway's protocol pings) go out through
// WriteControl, which is safe beside both. done is closed once serve has
// returned and no flusher runs: nothing is written after it.
type conn struct {
	g       *Gateway
	ws      *websocket.Conn
	uid     string
	segment string
	log     *slog.Logger
	// user is the user's place on this gateway, shared by their
	// connections here; since is when c registered there, since the
	// gateway started. Both are set by hub.add, before serve.
	user  *user
	since time.Duration

	// pingAt and grant are the last ping that asked for a renewal: when it
	// came, in ns since the gateway started (a monotonic clock), and the
	// TTL in ns it was granted, or would have been: grant is negative
	// until the renewal is written, so also when it failed, and 0 before
	// the first ping and once the user ended the session. serve writes
	// them, grant first; the resync loop reads them, pingAt first, so it
	// never pairs a ping with the grant of an earlier one.
	pingAt, grant atomic.Int64
	// deadlineMS is the deadline of the last renewal's own grant (Unix
	// ms, Redis's clock), told in each pong; a pong answered from the
	// last grant tells the same. The session's may be later (another
	// device's longer grant).
	deadlineMS atomic.Int64
	// normalClose: the client closed with 1000, the user leaving on
	// purpose, or the gateway closed with 4000 after a close stage's
	// guide (see inactive.go). release ends the session if this was
	// their last connection anywhere. closedAt is when (ns since the
	// gateway started), the time the end is recorded at; it is stored
	// before grant goes to 0, so whoever sees the grant gone sees it.
	normalClose atomic.Bool
	closedAt    atomic.Int64
	// inactive: the guide of a close stage was written, and the
	// connection is being closed with 4000; nothing is read or written
	// on it any more.
	inactive atomic.Bool
	done     chan struct{}

	// expiresMS is when the connection's token expires (Unix ms); an
	// auth frame with a fresh token moves it later. revoked: the token
	// expired and the connection is being closed. See auth.go.
	expiresMS atomic.Int64
	revoked   atomic.Bool
	expiry    *time.Timer // guarded by mu

	mu       sync.Mutex
	queue    []outFrame // frames waiting for the flusher; bounded, see enqueue
	flushing bool       // a flusher is running
	closed   bool       // serve returned, or a write failed: enqueue refuses
	flushers sync.WaitGroup
	// closeSet: the gateway closes the connection; enqueue refuses from
	// then on (nothing is written after a close frame), later closes are
	// dropped, and a close the client answers with is not its own.
	closeSet bool
	// pendingClose is the close frame a running flusher writes once the
	// frames queued before it are written, so a guide queued before a
	// close is not lost to it.
	pendingClose []byte
	// unproven are the guide frames queued and not yet proven received,
	// in the order queued (proofSeq numbers them); guideIDs the ids of
	// the last guides queued, which a pushed copy does not repeat. See
	// proof.go.
	unproven []*guideProof
	proofSeq uint64
	guideIDs []string

	// hold is the hold of a connection that asked to ping first (see
	// present.go) while it lasts, else nil; set before the connection is
	// served, and dropped once over.
	hold *hold
	// presentUntilMS is when, by its client's word, its user's session
	// would have run out had they reached us (Unix ms, Redis's clock; 0:
	// no word): a guide of a silence that ran out before it is dropped.
	presentUntilMS atomic.Int64
}

func (c *conn) serve(ctx context.Context) {
	defer c.finish(ctx)

	limiter := rate.NewLimiter(rate.Limit(c.g.cfg.RatePerSecond), c.g.cfg.RateBurst)
	c.ws.SetReadLimit(int64(c.g.cfg.ReadLimit))
	c.ws.SetReadDeadline(time.Now().Add(c.g.cfg.IdleTimeout))
	if c.revoked.Load() || c.inactive.Load() {
		// Closed while being set up (a guide pushed, a token run out):
		// the linger deadline that close set stands. Checked after the
		// deadline above, so that either order ends with the linger.
		c.ws.SetReadDeadline(time.Now().Add(c.closingLinger()))
	}
	c.ws.SetPongHandler(func(appData string) error {
		proved := c.pongProof(appData)
		if c.revoked.Load() || c.inactive.Load() {
			if proved && c.inactive.Load() && !c.awaitingProof() {
				// The close stage's guide is proven: the plain linger
				// is left of the wait for it.
				return c.ws.SetReadDeadline(time.Now().Add(lingerTimeout))
			}
			return nil // the linger deadline stands
		}
		return c.ws.SetReadDeadline(time.Now().Add(c.g.cfg.IdleTimeout))
	})
	for {
		typ, data, err := c.ws.ReadMessage()
		if err != nil {
			c.ended(err)
			return
		}
		if !c.handle(ctx, limiter, typ, data) {
			return
		}
	}
}

// finish ends c once nothing reads it any more: no frame is queued or
// written after it, and done tells whoever waits for c's proofs (an inbox
// handover, see push.go) that none will come. serve runs it when its
// reader returns; serveWS, for a connection the drain turned away before
// it was served. A connection that does not run it leaves its handovers
// waiting for good, and with them the drain, which waits for every
// goroutine of a connection.
func (c *conn) finish(ctx context.Context) {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.stopExpiry()
	c.ws.Close() // a flusher blocked in a write fails at once
	c.flushers.Wait()
	// A hold still on ends here: what it held goes back to the inbox.
	c.g.endHold(context.WithoutCancel(ctx), c, noPresence)
	close(c.done)
}

// handle answers one client frame and reports whether the connection
// stays open. It is kept out of serve's loop (not inlined), so the loop's
// frame, live for as long as a connection idles, holds none of its locals.
// An idle connection's goroutine stack is most of its memory (see
// bench/report.md).
//
//go:noinline
func (c *conn) handle(ctx context.Context, limiter *rate.Limiter, typ int, data []byte) bool {
	if c.inactive.Load() {
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
	if c.revoked.Load() || c.tokenExpired() {
		// Nothing a client sends after its token expired is taken, above
		// all no ping: it would renew a session nobody vouches for.
		c.expire()
		c.linger()
		return false
	}
	c.ws.SetReadDeadline(time.Now().Add(c.g.cfg.IdleTimeout))
	if !limiter.Allow() {
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
	if c.holding() {
		// The first frame ends the hold, before it is answered: the
		// inbox is judged by its word, not by its renewal.
		c.g.endHold(context.WithoutCancel(ctx), c, c.presenceOf(f))
	}
	if err := f.Validate(); err != nil {
		if frame.IsUnknownType(err) {
			metricFrames.WithLabelValues("unknown").Inc()
			c.enqueue(frame.Error(frame.CodeUnknownType, "unknown frame type"))
		} else {
			metricFrames.WithLabelValues("invalid").Inc()
			c.enqueue(frame.Error(frame.CodeBadFrame, err.Error()))
		}
		return true
	}
	metricFrames.WithLabelValues(f.Type).Inc()
	switch f.Type {
	case frame.TypePing:
		c.renew(ctx)
	case frame.TypeAck:
		// Proof of receipt only: an ack must not renew the session, or a
		// client that acks automatically would be guided every TTL.
		c.log.Debug("guide acknowledged", "guide_id", f.ID)
		c.ackProof(f.ID)
	case frame.TypeAuth:
		// Not activity either: a tab that refreshes its token while
		// nobody is at it is a silent user.
		c.refresh(f.Token)
	}
	return true
}

// renew grants the session TTL plus jitter and answers with a pong. A
// ping within the renewal granularity of the last renewal among the
// user's connections here, in its segment, shares it (see user.go).
func (c *conn) renew(ctx context.Context) {
	start := time.Now()
	now := start.Sub(c.g.start)
	p := c.g.policy.Current()
	ttl := p.TTL(c.segment)
	if p.Jitter > 0 {
		ttl += rand.N(p.Jitter)
	}
	ttl = ttl.Truncate(time.Millisecond)
	r, own := c.user.renewals.claim(c.segment, c.since, now, c.g.cfg.RenewGranularity, ttl)
	// Recorded before the renewal, so that a resync after an outage
	// restores it even if it fails. A shared one is the connection's own
	// too: its grant is what this connection stands for in a resync, or
	// among the dropped grants, should the one that renewed go first.
	c.grant.Store(-int64(r.ttl))
	c.pingAt.Store(int64(r.at))
	if !own {
		// Bounded by the write timeout of the ping that renews it.
		<-r.done
		if r.failed {
			c.enqueue(frame.Error(frame.CodeUnavailable, "session store unavailable, ping again"))
			return
		}
		metricRenewalsCoalesced.Inc()
		c.grant.Store(int64(r.ttl))
		c.deadlineMS.Store(r.deadlineMS)
		c.enqueue(frame.Pong((r.ttl - (now - r.at)).Milliseconds(), r.deadlineMS))
		return
	}
	// Not cancelled by the gateway's shutdown: a ping that arrived while
	// draining is still a renewal the user is owed.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.g.cfg.WriteTimeout)
	deadline, err := c.g.renewer.Renew(rctx, c.uid, c.segment, ttl)
	cancel()
	c.user.renewals.settle(r, deadline, err)
	metricRenewalSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		metricRenewals.WithLabelValues("error").Inc()
		c.g.renewLog.Fail(err)
		// The connection stays; the client's next ping retries.
		c.enqueue(frame.Error(frame.CodeUnavailable, "session store unavailable, ping again"))
		return
	}
	c.g.renewLog.OK()
	metricRenewals.WithLabelValues("ok").Inc()
	c.deadlineMS.Store(deadline.UnixMilli())
	c.grant.Store(int64(ttl))
	// The pong tells this connection's own grant, not the session's
	// deadline, which another device of the user (a segment with a longer
	// TTL) may hold later: the client paces its pings by it, and must keep
	// its own session alive once that other grant has run out. The
	// deadline it counts from it is never later than Redis's; deadline
	// is this grant's own, Redis's now plus ttl (see Renewer.Renew).
	c.enqueue(frame.Pong(ttl.Milliseconds(), deadline.UnixMilli()))
}

// lastGrant is what is left, at now (since the gateway started), of the
// last grant: the deadline the last ping was given, or would have been
// had Redis been in reach. ok is false when nothing is left, or nothing
// was granted.
func (c *conn) lastGrant(now time.Duration) (g session.Grant, ok bool) {
	at := time.Duration(c.pingAt.Load())
	ttl := time.Duration(c.grant.Load())
	if ttl == 0 {
		return session.Grant{}, false
	}
	left := ttl.Abs() - (now - at)
	return session.Grant{UID: c.uid, Segment: c.segment, Left: left, Ago: now - at}, left > 0
}

// endAt is when c closed normally, since the gateway started, or 0.
func (c *conn) endAt() time.Duration { return time.Duration(c.closedAt.Load()) }

// ended handles the end of the read side. A normal close (1000) is the
// user leaving on purpose: unless they are still connected elsewhere,
// the session goes and no guide follows (release does it, with the route
// write that counts this connection out). Any other end leaves the
// session to run out.
func (c *conn) ended(err error) {
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		if errors.Is(err, websocket.ErrReadLimit) {
			// gorilla/websocket has sent the 1009 close frame.
			metricCloses.WithLabelValues(strconv.Itoa(websocket.CloseMessageTooBig)).Inc()
			c.linger()
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
	ours := c.closeSet
	c.mu.Unlock()
	if ours {
		// A 1000 in answer to the gateway's own close (4001, 1001, ...):
		// RFC 6455 only says a client "typically" echoes the code, and
		// many answer 1000 whatever they got. The user did not leave.
		return
	}
	// Marked first, so that a resync does not restore the session; one
	// that read the grant before is caught after (see resyncConns).
	c.closedAt.Store(int64(time.Since(c.g.start)))
	c.grant.Store(0)
	c.normalClose.Store(true)
}

// closeWith sends a close frame with code and reason, once, after the
// frames already queued: while a flusher runs, it is left to the flusher.
func (c *conn) closeWith(code int, reason string) {
	msg := websocket.FormatCloseMessage(code, reason)
	c.mu.Lock()
	if c.closeSet {
		c.mu.Unlock()
		return
	}
	c.closeSet = true
	metricCloses.WithLabelValues(strconv.Itoa(code)).Inc()
	if c.flushing {
		c.pendingClose = msg
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
		c.ws.NetConn().Close() // unblocks serve's read, which cleans up
	}
}

// linger waits briefly for the client to read our close frame and hang up,
// discarding what it still sends. Closing the socket with unread input
// would reset the connection, and the client could lose the close code.
func (c *conn) linger() {
	nc := c.ws.NetConn()
	nc.SetReadDeadline(time.Now().Add(lingerTimeout))
	io.Copy(io.Discard, nc)
}

// lingerTimeout bounds linger.
const lingerTimeout = time.Second

// closingLinger is how long a connection the gateway closed is read
// after its close frame: the linger, or after a close stage's guide not
// yet proven, the wait for its proof (whose timer cuts the connection
// off at its end, and whose pong starts the plain linger).
func (c *conn) closingLinger() time.Duration {
	if c.inactive.Load() && c.awaitingProof() {
		return max(lingerTimeout, c.g.cfg.WriteTimeout)
	}
	return lingerTimeout
}

// outFrame is a frame waiting to be written, what to call once it is on
// the socket, and for a guide, its wait for proof (see proof.go).
type outFrame struct {
	b       []byte
	written func()
	proof   *guideProof
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
	if c.closed || c.closeSet {
		return false
	}
	if f.proof != nil && c.hasGuide(f.proof) {
		return true
	}
	if len(c.queue) >= c.g.cfg.SendQueue {
		c.closed = true
		metricSlowClients.Inc()
		c.log.Info("send queue full, closing slow client")
		c.ws.NetConn().Close() // unblocks serve's read, which cleans up
		return false
	}
	c.queue = append(c.queue, f)
	if f.proof != nil {
		c.proofSeq++
		f.proof.seq = c.proofSeq
		c.unproven = append(c.unproven, f.proof)
		c.recordGuide(f.proof.id)
	}
	if !c.flushing {
		c.flushing = true
		c.flushers.Add(1)
		go c.flush()
	}
	return true
}

// flush writes queued frames until the queue is empty, then exits.
func (c *conn) flush() {
	defer c.flushers.Done()
	for {
		c.mu.Lock()
		batch := c.queue
		c.queue = nil
		if len(batch) == 0 || c.closed {
			c.flushing = false
			closing := c.pendingClose
			c.pendingClose = nil
			closed := c.closed
			c.mu.Unlock()
			if closing != nil && !closed {
				c.ws.WriteControl(websocket.CloseMessage, closing, time.Now().Add(c.g.cfg.WriteTimeout))
			}
			return
		}
		c.mu.Unlock()
		for _, f := range batch {
			c.ws.SetWriteDeadline(time.Now().Add(c.g.cfg.WriteTimeout))
			if err := c.ws.WriteMessage(websocket.TextMessage, f.b); err != nil {
				c.mu.Lock()
				c.closed, c.flushing, c.queue = true, false, nil
				c.mu.Unlock()
				c.ws.NetConn().Close()
				return
			}
			if f.proof != nil {
				c.awaitProof(f.proof)
			}
			if f.written != nil {
				f.written()
				if c.inactive.Load() {
					// The frame ended the connection (closeInactive):
					// nothing goes out after its close frame.
					c.mu.Lock()
					c.flushing, c.queue = false, nil
					c.mu.Unlock()
					return
				}
			}
		}
	}
}
