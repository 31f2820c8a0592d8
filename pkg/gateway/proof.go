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
// Until then a guide waits on its connection (conn.unproven), from when it
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
// A close stage's guide is not handed on: it ended the session, and a
// copy routed live would close a connection the user is on.

// proofPingPrefix marks the payload of a ping that asks for proof.
const proofPingPrefix = "g"

// guideProof is one guide frame on a connection, waiting for proof.
type guideProof struct {
	id string
	// req is handed on when the connection ends unproven; nil leaves it to
	// proven's owner (an inbox handover, whose entry stays in the inbox).
	req *push.Request
	// proven is called once, on the reader's goroutine, when the client
	// proves it got the frame. It must not block. May be nil.
	proven func()

	seq   uint64      // its place among the connection's guides; c.mu
	timer *time.Timer // cuts the connection off if no proof comes; c.mu
}

// enqueueProven queues a guide frame that waits for proof once queued.
func (c *conn) enqueueProven(b []byte, p *guideProof, written func()) bool {
	return c.enqueueFrame(outFrame{b: b, written: written, proof: p})
}

// recentGuides is how many guide ids a connection remembers having been
// sent: a few silences' stages.
const recentGuides = 8

// hasGuide reports whether c was sent p's guide already, for a pushed
// copy (one handed on from another connection of the user, a resend): the
// client has it, or c hands it on itself if it never proves it. c.mu is
// held.
func (c *conn) hasGuide(p *guideProof) bool {
	return p.req != nil && slices.Contains(c.guideIDs, p.id)
}

// recordGuide remembers that guide id was queued on c. c.mu is held.
func (c *conn) recordGuide(id string) {
	if len(c.guideIDs) == recentGuides {
		c.guideIDs = slices.Delete(c.guideIDs, 0, 1)
	}
	c.guideIDs = append(c.guideIDs, id)
}

// awaitProof runs on the flusher once p's frame is written: it asks for
// proof with a ping and cuts the connection off if none comes in time.
func (c *conn) awaitProof(p *guideProof) {
	c.mu.Lock()
	seq := p.seq
	if len(c.unproven) > 0 && c.unproven[0].seq <= seq { // not proven yet (an early ack)
		p.timer = time.AfterFunc(c.g.cfg.WriteTimeout, func() { c.proofOverdue(seq) })
	}
	c.mu.Unlock()
	payload := []byte(proofPingPrefix + strconv.FormatUint(seq, 10))
	c.ws.WriteControl(websocket.PingMessage, payload, time.Now().Add(c.g.cfg.WriteTimeout))
}

// proofOverdue cuts c off if the guide seq is still unproven: its client
// is gone, or cannot take frames. serve's read fails at once, and
// release hands the guide on.
func (c *conn) proofOverdue(seq uint64) {
	c.mu.Lock()
	overdue := len(c.unproven) > 0 && c.unproven[0].seq <= seq
	c.mu.Unlock()
	if overdue {
		metricProofTimeouts.Inc()
		c.log.Info("guide not proven received in time: closing the connection, the guide goes to the user's next one")
		c.ws.NetConn().Close()
	}
}

// pongProof takes a pong's payload: one answering a proof ping proves
// every guide written before it.
func (c *conn) pongProof(appData string) {
	s, ok := strings.CutPrefix(appData, proofPingPrefix)
	if !ok {
		return
	}
	if seq, err := strconv.ParseUint(s, 10, 64); err == nil {
		c.proved(seq)
	}
}

// ackProof takes an ack frame's id: it proves that guide, and the ones
// written before it.
func (c *conn) ackProof(id string) {
	c.mu.Lock()
	var seq uint64
	for _, p := range c.unproven {
		if p.id == id {
			seq = p.seq
		}
	}
	c.mu.Unlock()
	if seq > 0 {
		c.proved(seq)
	}
}

// ackProofOf is ackProof for a raw frame that handle does not parse
// otherwise (the connection is closing).
func (c *conn) ackProofOf(typ int, data []byte) {
	if typ != websocket.TextMessage {
		return
	}
	if f, err := frame.Parse(data); err == nil && f.Type == frame.TypeAck && f.ID != "" {
		c.ackProof(f.ID)
	}
}

// proved settles the guides up to seq as received.
func (c *conn) proved(seq uint64) {
	c.mu.Lock()
	n := 0
	for n < len(c.unproven) && c.unproven[n].seq <= seq {
		n++
	}
	done := c.unproven[:n:n]
	c.unproven = c.unproven[n:]
	for _, p := range done {
		if p.timer != nil {
			p.timer.Stop()
		}
	}
	c.mu.Unlock()
	for _, p := range done {
		if p.proven != nil {
			p.proven()
		}
	}
}

// takeUnproven returns the guides c never proved, once it has ended:
// serve has returned, so no frame is queued or proven any more.
func (c *conn) takeUnproven() []*guideProof {
	c.mu.Lock()
	defer c.mu.Unlock()
	left := c.unproven
	c.unproven = nil
	for _, p := range left {
		if p.timer != nil {
			p.timer.Stop()
		}
	}
	return left
}

// handOn routes the live guides c ended without proving, as a push does
// (see route), unless their user renewed after their deadline. It runs
// in release, after the route write that counts c out.
func (g *Gateway) handOn(ctx context.Context, c *conn) {
	for _, p := range c.takeUnproven() {
		if p.req == nil {
			continue
		}
		req := *p.req
		pctx, cancel := context.WithTimeout(ctx, pushTimeout)
		if req.DeadlineMS > 0 {
			renewed, err := g.store.LastRenewed(pctx, req.UID)
			if err == nil && renewed.UnixMilli() > req.DeadlineMS {
				cancel()
				metricPushes.WithLabelValues("handed_on_stale").Inc()
				continue
			}
		}
		res, err := g.route(pctx, req)
		cancel()
		if err != nil {
			g.pushLog.Fail(err)
			g.log.Warn("a guide the connection never proved it got is lost", "uid", req.UID, "guide_id", req.ID, "err", err)
			continue
		}
		metricPushes.WithLabelValues("handed_on").Inc()
		c.log.Debug("guide not proven received: handed on", "guide_id", req.ID, "status", res.Status)
	}
}
