package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
)

// A silence the network made is not a silence. A user who keeps typing
// while their network is gone (a train, a lift, a Wi-Fi hand-over) could
// not reach us: their session runs out, its guides are kept in their
// inbox, and without more they would be handed "Are you still there?" on
// the reconnect, by then the only frames nobody judged against what the
// client saw.
//
// So a client that recorded such activity says so before the inbox is
// handed over. It connects with first=ping, and its first frame is a ping
// with active_ago_ms: how long before the ping its user was last active
// without a silence of a full TTL since its last renewal. The gateway
// holds the connection's guides, from the inbox and pushed live, until
// that first frame (or firstPingWait, whichever is first), and reads the
// word as a renewal the user would have made then: the session would have
// run until then plus the segment's TTL (without jitter: the least a
// renewal grants), by Redis's clock. A guide whose silence ran out before
// that (its deadline_ms) is dropped as superseded, the inbox's in the take
// script with the stale and the expired ones, a live one when it is
// enqueued; its stage is marked stale in the listener's dedup window, as
// the consumer marks the silences it finds over, so that a real silence
// in the same minute is guided at once. The ping then renews the session,
// which makes every later stage of that silence stale.
//
// The word is the client's, and is trusted as far as it matters: it can
// only drop guides of its own user, which that user's client would not
// show anyway. It cannot reach into the future (the ago is at least 0, by
// Redis's clock), and an ago over frame.MaxActiveAgoMS is not taken. A
// client that does not ask for the hold, or sends no word, gets its inbox
// at once, as before.

// guideTake is what became of a guide handed to a connection.
type guideTake int

const (
	// guideRefused: the connection is closing, or was cut off.
	guideRefused guideTake = iota
	// guideTaken: queued for the socket, or held until the hold ends.
	guideTaken
	// guideSuperseded: the user was present after its deadline, by their
	// client's word; nothing is sent.
	guideSuperseded
	// guideCancelled: a close stage's guide whose close was cancelled, the
	// user having come back before any connection wrote it (see
	// commitClose); nothing is sent, here or anywhere.
	guideCancelled
)

// superseded reports whether a guide of the silence that ran out at
// deadlineMS is one the user's client says they were present for: their
// session would have run until presentUntilMS (0: the client said
// nothing). A guide that does not say its deadline is not judged.
func superseded(deadlineMS, presentUntilMS int64) bool {
	return deadlineMS > 0 && presentUntilMS > 0 && deadlineMS < presentUntilMS
}

// presence is a client's word on its user's activity it could not report:
// how long before now they were last active (ms, -1: not said), and the
// TTL a renewal then would have granted.
type presence struct {
	agoMS, ttlMS int64
}

// noPresence is no word.
var noPresence = presence{agoMS: -1}

// presenceOf reads a first frame's word: a ping's active_ago_ms.
func (c *conn) presenceOf(f frame.Client) presence {
	if f.Type != frame.TypePing || !f.HasActiveAgo {
		return noPresence
	}
	return presence{agoMS: f.ActiveAgoMS, ttlMS: c.g.policy.Current().TTL(c.segment).Milliseconds()}
}

// firstPingWait bounds the hold of a connection that asked for it: a
// client that said it would ping first and did not gets its inbox anyway.
func (c Config) firstPingWait() time.Duration {
	if c.firstPingWaitFor > 0 {
		return c.firstPingWaitFor
	}
	return defaultFirstPingWait
}

// defaultFirstPingWait is firstPingWait's default: a first frame comes
// one round trip after the upgrade, slow networks included.
const defaultFirstPingWait = 5 * time.Second

// hold is a connection's hold, from its connect until endHold has
// queued what it hands over: guides pushed to it wait in held, and its
// inbox is not handed over yet; frames its client sends meanwhile wait in
// after, to be answered once it has (a ping's renewal would make every
// inbox entry stale). ending: endHold has begun; done is closed once it
// has queued what it hands over, and answered what waited. Guarded by the
// connection's mu, but done. Once the hold is over, the connection drops
// it (its hold is nil): a connection lives long after its first frame.
type hold struct {
	ending bool
	held   []push.Request
	after  []frame.Client
	timer  *time.Timer
	done   chan struct{}
}

// holdOf is c's hold, or nil. c.mu is held.
func (c *conn) holdOf() *hold {
	if c.x == nil {
		return nil
	}
	return c.x.hold
}

// holdsGuide reports whether c holds a pushed guide of id, to send once
// its hold ends.
func (c *conn) holdsGuide(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.holdOf()
	return h != nil && slices.ContainsFunc(h.held, func(r push.Request) bool { return r.ID == id })
}

// holding reports whether c holds its guides still.
func (c *conn) holding() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holdOf() != nil
}

// holdGuides makes c hold its guides until endHold, at firstPingWait at
// the latest. Called before c is in the hub, where pushes find it.
func (g *Gateway) holdGuides(ctx context.Context, c *conn) {
	h := &hold{done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.more().hold = h
	h.timer = time.AfterFunc(g.cfg.firstPingWait(), func() { g.endHold(ctx, c, noPresence) })
}

// afterHold leaves f's answer to the end of c's hold, if c holds its
// guides still, and reports whether it did. The first frame ends the
// hold, with its word, on a goroutine of its own: the inbox is read from
// Redis, and the reader does not wait.
func (c *conn) afterHold(f frame.Client) bool {
	c.mu.Lock()
	h := c.holdOf()
	if h == nil {
		c.mu.Unlock()
		return false
	}
	h.after = append(h.after, f)
	first := !h.ending
	var closed bool
	if first {
		closed = h.begin(c)
	}
	c.mu.Unlock()
	if first {
		// The connection's own count in g.conns holds until Closed's
		// goroutine ends, after this frame: the count is not at zero.
		c.g.conns.Add(1)
		p := c.presenceOf(f)
		go func() {
			defer c.g.conns.Done()
			c.g.endBegun(context.Background(), c, h, p, closed)
		}()
	}
	return true
}

// begin marks h's end begun, and reports whether c was closed then.
// c.mu is held.
func (h *hold) begin(c *conn) (closed bool) {
	h.ending = true
	h.timer.Stop()
	return c.is(flagClosed)
}

// endHold ends c's hold, once: at its first frame, with that frame's word
// p (see afterHold), at firstPingWait, or when the connection ends. It
// hands over the inbox judged by p, then the guides pushed meanwhile,
// each judged by it too, in the order they came, then answers the frames
// read meanwhile, and returns once that is done; a caller that comes
// second waits for that. So the first frame's ping is not renewed before
// the inbox is judged (the renewal would make every entry stale). Guides
// held by a connection that ended go back to the inbox.
func (g *Gateway) endHold(ctx context.Context, c *conn, p presence) {
	c.mu.Lock()
	h := c.holdOf()
	if h == nil {
		c.mu.Unlock()
		return
	}
	if h.ending {
		c.mu.Unlock()
		<-h.done
		return
	}
	closed := h.begin(c)
	c.mu.Unlock()
	g.endBegun(ctx, c, h, p, closed)
}

// endBegun is endHold's work, once its end is begun.
func (g *Gateway) endBegun(ctx context.Context, c *conn, h *hold, p presence, closed bool) {
	var rest *handover
	if !closed {
		rest = g.handOverInbox(ctx, c, p)
	}
	var dropped, over, left, undecided []push.Request
	for {
		c.mu.Lock()
		held, after := h.held, h.after
		h.held, h.after = nil, nil
		if len(held) == 0 && len(after) == 0 {
			// Over: everything is queued and answered, and guides pushed
			// and frames read from now on are taken as they come.
			// Callers that find no hold from here on find it over.
			c.x.hold = nil
			c.mu.Unlock()
			break
		}
		c.mu.Unlock()
		// Oldest silence first, and its stages in order: a guide handed
		// on to this hold after a later stage of its silence (a reminder
		// from a device that dropped) must not follow that close stage.
		slices.SortStableFunc(held, func(a, b push.Request) int {
			return cmp.Or(cmp.Compare(a.DeadlineMS, b.DeadlineMS), cmp.Compare(a.Stage, b.Stage))
		})
		for _, req := range held {
			// Held up to firstPingWait: judged again, as any guide late
			// on its way is (see late.go).
			if g.cameBackRouted(ctx, &req) {
				over = append(over, req)
				continue
			}
			// Decided as a delivery's is, so that a copy held by a
			// connection the user opened after the chat closed does not
			// close it (closeDecision.openedAfter).
			d := &closeDecision{}
			switch c.takeGuide(ctx, req, d) {
			case guideCancelled:
				over = append(over, req)
			case guideSuperseded:
				dropped = append(dropped, req)
				if rest != nil {
					// Its entry may be a close applied elsewhere.
					rest.handClosed(req.ID)
				}
			case guideRefused:
				if d.err != nil {
					undecided = append(undecided, req)
				} else {
					left = append(left, req)
				}
			}
		}
		for _, f := range after {
			c.answer(f)
		}
	}
	close(h.done)
	g.markSuperseded(ctx, c.uid, dropped)
	g.markCameBack(ctx, c.uid, over, "held by a connection until its first frame, and the user renewed after its deadline meanwhile: not sent")
	if len(dropped) > 0 {
		// The handover left their entries to the held copies; an entry
		// of a close applied elsewhere stays, whatever the client said,
		// and is this connection's now. One the handover took is queued
		// already (handClosed); one kept since is taken here.
		g.offerInbox(ctx, c.uid)
	}
	for _, req := range undecided {
		// Its push answered delivered long ago, and nothing pushes it
		// again: kept, the inbox's copy would close none of the user's
		// connections here. Tried again for a while instead, as a routed
		// copy undecided is.
		if payload, err := json.Marshal(req); err == nil {
			g.redeliverUndecided(ctx, req, payload)
		}
	}
	for _, req := range left {
		// As for a guide routed here for a user who has just left.
		kctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
		if _, err := g.keepReq(kctx, req, false); err != nil {
			g.pushLog.Fail(err)
		}
		cancel()
	}
	rest.goRun(ctx)
}

// markSuperseded marks the listener's dedup window of each guide's stage
// stale, as the consumer does for a silence it finds over, so that another
// silence of the user in that minute is guided at once. Best effort, on a
// goroutine of its own: a mark lost only makes that silence's guide wait
// for the window's end.
func (g *Gateway) markSuperseded(ctx context.Context, uid string, reqs []push.Request) {
	for _, req := range reqs {
		// After a consumer's "sent" for it: not shown after all.
		g.timeline.Record(uid, supersededEntry(req))
	}
	g.settleOver(ctx, uid, reqs)
}

// markCameBack is markSuperseded for guides found over by the user's
// renewals (see cameBack), how saying where.
func (g *Gateway) markCameBack(ctx context.Context, uid string, reqs []push.Request, how string) {
	metricPushes.WithLabelValues("came_back").Add(float64(len(reqs)))
	for _, req := range reqs {
		g.timeline.Record(uid, skippedEntry(req, ruleCameBack, how))
	}
	g.settleOver(ctx, uid, reqs)
}

// settleOver takes guides whose silence is over out of uid's inbox, and
// marks their stages' dedup windows stale.
func (g *Gateway) settleOver(ctx context.Context, uid string, reqs []push.Request) {
	if len(reqs) == 0 || !g.track(1) {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer g.conns.Done()
		// Kept ahead of its delivery, it leaves the inbox too: the user
		// was there. Not a close stage's whose close was applied
		// elsewhere: the client's word does not drop those. Not marked
		// settled: such a close may yet be applied and kept (a copy
		// kept otherwise is stale by the renewal the word came with).
		drops := make([]session.InboxDrop, len(reqs))
		for i, req := range reqs {
			drops[i] = session.InboxDrop{UID: uid, ID: req.ID}
		}
		dctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
		if _, err := g.store.DropFromInboxes(dctx, drops, session.DropHow{KeepClosed: true}); err != nil {
			g.log.Debug("take superseded guides out of the inbox", "uid", uid, "err", err)
		}
		cancel()
		for _, req := range reqs {
			due, ok := stageDue(req)
			if !ok {
				continue
			}
			mctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
			err := g.store.MarkStale(mctx, uid, max(req.Stage, 1), time.UnixMilli(due), time.UnixMilli(req.DeadlineMS))
			cancel()
			if err != nil {
				g.log.Debug("mark a superseded guide's silence stale", "uid", uid, "guide_id", req.ID, "err", err)
			}
		}
	}()
}

// stageDue is when a guide's stage was due (Unix ms), which names its
// dedup window: due_ms, or for stage 1 the deadline. ok is false when the
// guide does not say.
func stageDue(req push.Request) (int64, bool) {
	switch {
	case req.DeadlineMS <= 0:
		return 0, false
	case req.DueMS > 0:
		return req.DueMS, true
	case req.Stage <= 1:
		return req.DeadlineMS, true
	}
	return 0, false
}

// parseEntries reads inbox entries as the requests they are, skipping any
// that do not parse.
func parseEntries(raw []string) []push.Request {
	var reqs []push.Request
	for _, e := range raw {
		if req, ok := parseEntry(e); ok {
			reqs = append(reqs, req)
		}
	}
	return reqs
}

// parseEntry reads an inbox entry as the request it was kept from. An
// entry is the request's JSON with the times of its keeping added (the
// inbox entry's format, in the session package's values.go), which a
// Request does not know and skips: so an entry of any release reads as
// its request. ok is false when it does not parse or has no id, which
// the inbox's lease of it is by.
func parseEntry(raw string) (req push.Request, ok bool) {
	if json.Unmarshal([]byte(raw), &req) != nil || req.ID == "" {
		return push.Request{}, false
	}
	return req, true
}
