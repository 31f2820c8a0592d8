package gateway

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
)

// A write that succeeds says only that the kernel took the frame. A
// connection whose client lost its network without a FIN (a phone in a
// lift, a laptop closed on the move) takes writes until its send buffer
// fills, and a guide written to it would be lost with it. So a guide frame
// counts as received only once the client proves it: by acking its id, or
// by answering the protocol ping the flusher sends right after the frame.
// TCP keeps order, so a pong to that ping means the guide came first; and
// every WebSocket client answers pings (browsers on their own), so
// clients that never ack prove their guides too.
//
// Until then a guide waits on its connection (extra.unproven), from when it
// is queued: a frame queued but never written is as unproven as one
// written to a dead peer. A connection that has not proven a guide within
// WriteTimeout of writing it is cut off, as one whose write timed out
// would be. When a connection ends with guides unproven, release hands them
// on (handOn) as a push would route them: to the user's other connections,
// or to their inbox for the next connect; unless the user renewed after
// the guide's deadline, on any device: they are back, and it is stale.
// An inbox guide handed over on connect leaves the inbox only once proven
// (see handover); unproven, it stays for the next connect.
// A guide a connection holds until its client's first frame (see
// present.go) is not sent, so not unproven: it waits for proof from when
// the hold ends and queues it, and one still held when the connection
// ends goes back to the inbox, as never sent.
//
// A connection is not sent a pushed guide it was sent already (a copy
// handed on from the user's other device, a resend): it has it, or hands
// it on itself. A client that got a guide but dropped before its proof
// was read is sent it again on its next connection: clients show a guide
// once per id (the JavaScript client does).
//
// A close stage's guide waits for proof too, but is never routed live:
// a copy would close a connection the user is on. Unproven, it goes to
// the user's inbox (see handOnWayOf). Once written, its close was applied
// (inactive.go): the chat is closed and the session ended, recorded as the
// user's last renewal, after the guide's deadline. So its inbox entry is
// marked closed and judged from then on (see session.Store.KeepGuide):
// only a renewal after it was kept makes it stale, and the client's word
// of activity does not supersede it. Handed over on connect, it closes nothing: the
// user is back, on that connection (see handover.queue).

// proofPingPrefix marks the payload of a ping that asks for proof.
const proofPingPrefix = "g"

// guideProof is one guide frame on a connection, waiting for proof.
type guideProof struct {
	id string
	// req is handed on when the connection ends unproven; nil leaves it to
	// proven's owner (an inbox handover, whose entry stays in the inbox).
	req *push.Request
	// proven is called once, on the reader's goroutine, when the client
	// proves it got the frame; or, for a pushed copy of a guide proven on
	// the connection before, when the copy is queued. It must not block.
	// May be nil.
	proven func()

	seq   uint64      // its place among the connection's guides; c.mu
	timer *time.Timer // cuts the connection off if no proof comes; c.mu
	// written: the frame is on the socket, so for a close stage's guide,
	// its close was applied; c.mu.
	written bool
	// there: an inbox copy of a close stage handed to a connection open
	// since before its close was applied, ahead of a live copy that may
	// still reach it (see closesAfterCopy). Set before it is queued.
	there bool
}

// awaitingFrom makes p's guide, queued on c, wait for proof from now on.
// c.mu is held.
func (c *conn) awaitingFrom(p *guideProof) {
	x := c.more()
	x.proofSeq++
	p.seq = x.proofSeq
	x.unproven = append(x.unproven, p)
	if len(x.guideIDs) == recentGuides {
		x.guideIDs = slices.Delete(x.guideIDs, 0, 1)
		x.acked >>= 1
		x.proven >>= 1
		x.there >>= 1
	}
	x.guideIDs = append(x.guideIDs, p.id)
	if p.there {
		x.there |= 1 << (len(x.guideIDs) - 1)
	}
}

// unproven is the guides queued on c and not proven yet. c.mu is held.
func (c *conn) unproven() []*guideProof {
	if c.x == nil {
		return nil
	}
	return c.x.unproven
}

// enqueueProven queues a guide frame that waits for proof once queued.
func (c *conn) enqueueProven(b []byte, p *guideProof, written func()) bool {
	return c.enqueueFrame(outFrame{b: b, written: written, proof: p})
}

// recentGuides is how many guide ids a connection remembers having been
// sent: a few silences' stages. At most 8: the bits of connExtra.acked.
const recentGuides = 8

// hasGuide reports whether c was sent p's guide already, for a pushed
// copy (one handed on from another connection of the user, a resend): the
// client has it, or c hands it on itself if it never proves it. c.mu is
// held.
func (c *conn) hasGuide(p *guideProof) bool {
	return p.req != nil && c.x != nil && slices.Contains(c.x.guideIDs, p.id)
}

// isClosed reports whether c is closed: nothing is written to it any more.
func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.is(flagClosed)
}

// closesAfterCopy reports whether f, a pushed copy of a guide c was sent
// already (hasGuide), must still apply its close on c: a close stage's
// live copy (its written closes c, see takeGuide), where the copy c was
// sent is an inbox copy handed to c while c was there before the close
// was applied (guideProof.there). A take of the inbox can hand c the
// entry kept ahead of the live copy (see ahead.go) while that copy is on
// its way to c: an offer (a route refresh's, a keep's, see offerInbox),
// a later chunk's, or c's connect's own when its route write came after
// the keep. c was connected, its user silent, when the chat was closed,
// and the inbox copy closes nothing (see handover.queue). A connection
// opened after the close was applied is the user come back: the inbox
// copy it was handed told them, and a live copy that comes later (a
// routed copy read late, a resend) closes nothing. A second live copy
// finds the first waiting for proof, and adds nothing: once the first is
// written, c is closed. c.mu is held.
func (c *conn) closesAfterCopy(f outFrame) bool {
	if f.written == nil || f.proof.req == nil || !f.proof.req.Final {
		return false
	}
	for _, p := range c.unproven() {
		if p.id == f.proof.id && p.req != nil {
			return false
		}
	}
	for i, id := range c.x.guideIDs {
		if id == f.proof.id && c.x.there&(1<<i) != 0 {
			return true
		}
	}
	return false
}

// sentGuide reports whether c was queued a copy of guide id, among the
// last guides queued.
func (c *conn) sentGuide(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.x != nil && slices.Contains(c.x.guideIDs, id)
}

// provenHere reports whether c's client proved it got guide id, among
// the last guides queued. c.mu is held.
func (c *conn) provenHere(id string) bool {
	if c.x == nil {
		return false
	}
	for i, got := range c.x.guideIDs {
		if got == id && c.x.proven&(1<<i) != 0 {
			return true
		}
	}
	return false
}

// awaitProof runs on the flusher once p's frame is written: it asks for
// proof with a ping and cuts the connection off if none comes in time.
func (c *conn) awaitProof(p *guideProof) {
	c.mu.Lock()
	seq := p.seq
	p.written = true
	if u := c.unproven(); len(u) > 0 && u[0].seq <= seq { // not proven yet (an early ack)
		p.timer = time.AfterFunc(c.g.cfg.WriteTimeout, func() { c.proofOverdue(seq) })
	}
	c.mu.Unlock()
	payload := []byte(proofPingPrefix + strconv.FormatUint(seq, 10))
	c.ws.WriteControl(websocket.PingMessage, payload, time.Now().Add(c.g.cfg.WriteTimeout))
}

// proofOverdue cuts c off if the guide seq is still unproven: its client
// is gone, or cannot take frames. The reader fails at once, and release
// hands the guide on.
func (c *conn) proofOverdue(seq uint64) {
	c.mu.Lock()
	u := c.unproven()
	overdue := len(u) > 0 && u[0].seq <= seq
	c.mu.Unlock()
	if overdue {
		metricProofTimeouts.Inc()
		c.g.log.Info("guide not proven received in time: closing the connection, the guide goes to the user's next one", "uid", c.uid)
		c.ws.NetConn().Close()
	}
}

// pongProof takes a pong's payload: one answering a proof ping proves
// every guide written before it. It reports whether it proved any.
func (c *conn) pongProof(appData string) bool {
	s, ok := strings.CutPrefix(appData, proofPingPrefix)
	if !ok {
		return false
	}
	seq, err := strconv.ParseUint(s, 10, 64)
	return err == nil && c.proved(seq)
}

// awaitingProof reports whether a guide queued on c is not proven yet.
func (c *conn) awaitingProof() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.unproven()) > 0
}

// ackProof takes an ack frame's id: it proves that guide, and the ones
// written before it. It reports whether the ack is news for the user's
// timeline: the first ack of one of the guides last queued on c, so that
// a client can fill it neither with acks of ids it made up nor with one
// guide's ack repeated.
func (c *conn) ackProof(id string) (known bool) {
	c.mu.Lock()
	var seq uint64
	// The first copy of the id: a client reads in order, so an ack
	// proves nothing queued after it (an inbox copy may follow a live
	// one, and the guides between were not read). A copy proven already
	// (its pong came first) is the one acked: the ack proves no more.
	if !c.provenHere(id) {
		for _, p := range c.unproven() {
			if p.id == id {
				seq = p.seq
				break
			}
		}
	}
	known = seq > 0
	if c.x != nil {
		if i := slices.Index(c.x.guideIDs, id); i >= 0 {
			// Known, but news for the timeline only the first time.
			known = c.x.acked&(1<<i) == 0
			c.x.acked |= 1 << i
		}
	}
	c.mu.Unlock()
	if seq > 0 {
		c.proved(seq)
	}
	return known
}

// ackProofOf is ackProof for a raw frame that Message does not parse
// otherwise (the connection is closing).
func (c *conn) ackProofOf(typ int, data []byte) {
	if typ != websocket.TextMessage {
		return
	}
	if f, err := frame.Parse(data); err == nil && f.Type == frame.TypeAck && f.ID != "" {
		if c.ackProof(f.ID) {
			c.g.timeline.Record(c.uid, ackedEntry(f.ID))
		}
	}
}

// proved settles the guides up to seq as received, and reports whether
// there were any.
func (c *conn) proved(seq uint64) bool {
	c.mu.Lock()
	u := c.unproven()
	n := 0
	for n < len(u) && u[n].seq <= seq {
		n++
	}
	if n == 0 {
		c.mu.Unlock()
		return false
	}
	done := u[:n:n]
	c.x.unproven = u[n:]
	for _, p := range done {
		if p.timer != nil {
			p.timer.Stop()
		}
		for i, id := range c.x.guideIDs {
			if id == p.id {
				c.x.proven |= 1 << i
			}
		}
	}
	c.mu.Unlock()
	for _, p := range done {
		if p.proven != nil {
			p.proven()
		}
	}
	return n > 0
}

// takeUnproven returns the guides c never proved, once it has ended:
// reading has, so no frame is queued or proven any more.
func (c *conn) takeUnproven() []*guideProof {
	c.mu.Lock()
	defer c.mu.Unlock()
	left := c.unproven()
	if c.x != nil {
		c.x.unproven = nil
	}
	for _, p := range left {
		if p.timer != nil {
			p.timer.Stop()
		}
	}
	return left
}

// handOnWay is what becomes of a live guide a connection ended without
// proving.
type handOnWay int

const (
	// handOnRoute: routed as a push routes it, to the user's other
	// connections or their inbox, unless stale by their last renewal.
	handOnRoute handOnWay = iota
	// handOnKeep: a close stage's guide never written (the connection
	// ended first), whose close was not applied here: kept in the inbox,
	// as for a user connected nowhere, unless stale by their last renewal.
	handOnKeep
	// handOnKeepClosed: a close stage's guide written, whose close was
	// applied: kept in the inbox marked closed, judged from when it is
	// kept (the session's end its close recorded is no renewal).
	handOnKeepClosed
)

// handOnWayOf decides where an unproven guide goes: a close stage's
// (final) only ever to the inbox, since a copy routed live would close a
// connection the user is on; written, it is marked closed.
func handOnWayOf(final, written bool) handOnWay {
	switch {
	case !final:
		return handOnRoute
	case written:
		return handOnKeepClosed
	}
	return handOnKeep
}

// handOn hands on the live guides c ended without proving (see
// handOnWayOf). It runs in release, after the route write that counts c
// out: that write ends the session after a close stage, so the closed
// entry is kept after the end it recorded.
func (g *Gateway) handOn(ctx context.Context, c *conn) {
	for _, p := range c.takeUnproven() {
		if p.req == nil {
			continue
		}
		req := *p.req
		way := handOnWayOf(req.Final, p.written)
		pctx, cancel := context.WithTimeout(ctx, pushTimeout)
		if req.DeadlineMS > 0 && way != handOnKeepClosed {
			checked := g.redisNowMS()
			renewed, err := g.store.LastRenewed(pctx, req.UID)
			if err == nil && renewed.UnixMilli() > req.DeadlineMS {
				// Kept ahead, it is stale too; a close applied elsewhere
				// is judged by renewals after it was kept, and stays.
				if _, err := g.store.DropFromInboxes(pctx, []session.InboxDrop{{UID: req.UID, ID: req.ID}}, session.DropHow{KeepClosed: true}); err != nil {
					g.log.Debug("take a stale guide out of the inbox", "uid", req.UID, "guide_id", req.ID, "err", err)
				}
				cancel()
				metricPushes.WithLabelValues("handed_on_stale").Inc()
				g.timeline.Record(req.UID, skippedEntry(req, ruleCameBack, "its connection ended before proving it got it, and the user renewed after its deadline: not handed on"))
				continue
			}
			if err == nil {
				req.CheckedMS = checked
			}
		}
		var res push.Response
		var err error
		if way == handOnRoute {
			res, err = g.route(pctx, req)
		} else {
			// A connection of the user here that reconnected meanwhile is
			// offered the inbox by the keep.
			res.Status, err = g.keepReq(pctx, req, way == handOnKeepClosed)
		}
		cancel()
		if err != nil {
			g.pushLog.Fail(err)
			g.log.Warn("a guide the connection never proved it got is lost", "uid", req.UID, "guide_id", req.ID, "err", err)
			g.timeline.Record(req.UID, lostEntry(req, "its connection ended before proving it got it, and it could not be handed on: "+err.Error()))
			continue
		}
		if res.Status == push.TooOld {
			g.timeline.Record(req.UID, skippedEntry(req, ruleTooOld, "its connection ended before proving it got it: too old for the inbox"))
		}
		metricPushes.WithLabelValues("handed_on").Inc()
		if e, ok := sentEntry(req, res.Status, res.Connections, "handed on: its connection ended before proving it got it"); ok {
			g.timeline.Record(req.UID, e)
		}
		g.log.Debug("guide not proven received: handed on", "uid", c.uid, "guide_id", req.ID, "status", res.Status)
	}
}

// offerInbox hands uid's inbox over to their connections on this
// instance, as their connect did: a guide kept after a connection's route
// write (see keep), such as a close stage's guide kept by handOn whose
// user reconnected meanwhile, would otherwise wait for their next
// connect. (A connection on another instance gets it then.)
// A connection still holding its guides takes its inbox when its hold
// ends; one ending it is waited for, so the inbox is judged by its
// client's word first. A connection already being handed its inbox gets
// only what it was not: entries are leased to one connection at a time.
func (g *Gateway) offerInbox(ctx context.Context, uid string) {
	for _, c := range g.hub.lookup(uid) {
		c.mu.Lock()
		h := c.holdOf()
		holding := h != nil && !h.ending
		closed := c.is(flagClosed)
		c.mu.Unlock()
		if holding || closed {
			// A closed one (the keep may be its own, giving back what
			// it held) would lease the entries only to release them,
			// and a connection made meanwhile find them leased.
			continue
		}
		if h != nil {
			<-h.done
		}
		g.handOverInbox(ctx, c, noPresence).goRun(ctx)
	}
}
