package gateway

import (
	"context"
	"strconv"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
)

// A silence's last stage may close the chat (timeoutevent.ActionClose):
// its guide, marked final, is the last frame the user's connections get.
// Once a connection's flusher has written it, the connection is closed
// with frame.CloseInactive (4000, "inactive") and counts as the user's
// own normal close: its grant is not restored by a resync, it is not kept
// among the dropped, and release's route write ends the session when it
// was the user's last connection on any instance. A user on two devices
// gets the frame and the close on both, the session ending with the
// second.
//
// That frame waits for proof as every guide does (see proof.go): the
// close is applied once it is written, proven or not (the chat is closed,
// whether or not the user heard), and a connection that never proves it
// hands it on to the user's inbox, marked applied (see handOn), for the
// next connect: the user is told their chat was closed, as one connected
// nowhere at that moment is. The connection keeps reading frames, taking
// none, until the proof has come or its wait is over (see Message).
//
// A final guide handed over from the inbox on connect is written like any
// other and closes nothing: the user is back, on that very connection.
// One handed, while the live copy is on its way, to a connection open
// since before its close was applied (by an offer of the inbox, a route
// refresh's, or by that connection's connect crossing the push) closes
// nothing either, but the live copy that follows it there then closes
// the connection without writing the guide again (see closesAfterCopy):
// that device was there, silent, when the chat closed.

// closeDecision is a close stage's decision (commitClose) as the first of
// a delivery's connections to write it got it, for the others: one push
// decides once on an instance, so that a Redis failure for one call
// cannot leave one device of the user told and closed, another not and
// never (its entry kept ahead leaves the inbox once the first proves it).
// A failed decision refuses the guide on every connection of the
// delivery: none took it, and the caller keeps it for later.
//
// appliedAt is when the close was applied (Redis's clock, Unix ms; 0: not
// known): a connection opened after it is the user come back after the
// chat closed, and this delivery (a late one: a retry, a routed copy read
// late) does not close it. It comes with the decision, in one call, so
// that no delivery holds a decision without it.
type closeDecision struct {
	done      bool
	applied   bool
	err       error
	appliedAt int64
}

// decide returns d's decision of req, made now if not yet. d may be nil:
// a connection deciding alone.
func (d *closeDecision) decide(ctx context.Context, g *Gateway, req push.Request) (bool, error) {
	if d != nil && d.done {
		return d.applied, d.err
	}
	applied, at, err := g.commitClose(ctx, req)
	if d != nil {
		d.done, d.applied, d.err, d.appliedAt = true, applied, err, at
	}
	return applied, err
}

// openedAfter reports whether c opened after d's close was applied, as
// far as known.
func (d *closeDecision) openedAfter(c *conn) bool {
	return d != nil && d.appliedAt > 0 && c.openedMS > d.appliedAt
}

// enqueueGuide hands c a guide pushed to its user: held while c holds its
// guides (see present.go), unsent and so not yet waiting for proof; else
// as takeGuide does, with the delivery's close decision d.
func (c *conn) enqueueGuide(ctx context.Context, req push.Request, d *closeDecision) guideTake {
	c.mu.Lock()
	if h := c.holdOf(); h != nil {
		defer c.mu.Unlock()
		if c.is(flagClosed|flagCloseSet) || len(h.held) >= c.g.cfg.SendQueue {
			return guideRefused
		}
		h.held = append(h.held, req)
		return guideTaken
	}
	c.mu.Unlock()
	return c.takeGuide(ctx, req, d)
}

// takeGuide drops a guide whose silence c's client said its user was
// present for, or queues its frame, which waits on c for proof from then
// on (see proof.go); a close stage's (final) closes c too, once the frame
// is on the socket, if its close is applied (see commitClose), as d
// decided it for the delivery (nil: c decides alone).
func (c *conn) takeGuide(ctx context.Context, req push.Request, d *closeDecision) guideTake {
	if superseded(req.DeadlineMS, c.presentUntil()) {
		metricPushes.WithLabelValues("superseded").Inc()
		return guideSuperseded
	}
	if req.Final {
		switch applied, err := d.decide(ctx, c.g, req); {
		case err != nil:
			return guideRefused
		case !applied:
			return guideCancelled
		case d.openedAfter(c):
			// The user came back after the chat closed, on this
			// connection: it starts a new session, and is not closed.
			metricPushes.WithLabelValues("superseded").Inc()
			return guideSuperseded
		}
	}
	b := frame.Guide(req.ID, req.Text, req.DeadlineMS, req.Stage, req.Final)
	var closing func()
	if req.Final {
		closing = func() {
			if c.closeInactive() {
				c.g.timeline.Record(c.uid, closedEntry(req))
			}
		}
	}
	// Proven, it leaves the inbox it was kept in ahead (see ahead.go).
	proven := func() { c.g.ahead.add(req.UID, req.ID) }
	if !c.enqueueProven(b, &guideProof{id: req.ID, req: &req, proven: proven}, closing) {
		return guideRefused
	}
	return guideTaken
}

// closeInactive ends c after its close stage's guide, once, and reports
// whether it did so here. It runs on
// the flusher, which stops after it; the reader ends on the client's
// close frame, on any other frame once the guide is proven (Message checks
// inactive), or at the deadline set here (closingLinger), whichever is
// first.
func (c *conn) closeInactive() bool {
	if !c.set(flagInactive) {
		return false
	}
	// As ended does for a 1000 (see closeNormally).
	c.closeNormally()
	// This is the flusher, the one writer: the close frame is written
	// here, not left to closeWith, which would leave it to the flusher.
	// It replaces a close still queued behind the guide (a token that ran
	// out meanwhile, a drain), which the flusher drops with the rest of
	// its batch: the chat is over. (No close can have been written before
	// it: a close is the last frame queued, and the guide came first.)
	c.mu.Lock()
	c.set(flagClosed | flagCloseSet)
	c.more().closeCode = frame.CloseInactive
	c.dropQueue() // nothing may follow the close frame
	c.mu.Unlock()
	c.g.log.Debug("closing for inactivity after the close stage's guide", "uid", c.uid)
	metricCloses.WithLabelValues(strconv.Itoa(frame.CloseInactive)).Inc()
	msg := websocket.FormatCloseMessage(frame.CloseInactive, "inactive")
	c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(c.g.cfg.WriteTimeout))
	c.ws.NetConn().SetReadDeadline(time.Now().Add(c.closingLinger()))
	return true
}
