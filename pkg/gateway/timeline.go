package gateway

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
)

// What the gateway adds to users' timelines (package timeline): its
// decisions about a user's connections and turns, recorded where each
// took effect, off the caller's goroutine (Recorder.Record never waits).
// The entries are decided here, from the facts; the call sites only
// record them. Nothing is recorded on the renewal path but what its
// scripts record themselves, in the rare step that cancels a hold on a
// user's timeout: the hold's recheck, and the lapse stale (the store's
// HoldNotes; renewals, ends, activity and the last close alike).
//
// One owner per fact. The consumer records how each push was answered
// (sent delivered to N connections, kept in the inbox, skipped): the
// gateway does not record its push answers again. It records what only
// it sees: a guide handed over from the inbox on a connect, a guide
// routed here whose connections had gone (kept), one handed on because
// its connection ended before proving it, and each connection it closes
// with 4000 after a close stage's guide (closed). The consumer records a
// close stage's close only where no gateway applies it (kept in the
// inbox, or the webhook's).

// Rules of the gateway's entries: a small fixed set, the metric's rule
// label.
const (
	ruleStarted = "started" // start: the user's first connection on any gateway
	ruleJoined  = "joined"  // start: the user was connected elsewhere too
	// ruleConnected: start, the route not written (Redis out of reach):
	// how many others the user has is not known.
	ruleConnected = "connected"

	ruleSessionEnded = "session-ended" // end: the last normal close ended the session
	ruleNormal       = "normal"        // end: a normal close (1000), the user connected elsewhere still
	ruleByGateway    = "gateway"       // end: the gateway closed it (Code)
	ruleDropped      = "dropped"       // end: the connection dropped, or the client closed with another code

	ruleTurnUser  = "user"  // turn: the user's
	ruleTurnUs    = "us"    // turn: ours
	ruleTurnEnded = "ended" // turn: the platform ended the conversation

	ruleInactive = "inactive" // closed: a connection closed with 4000 after a close stage's guide

	ruleDelivered  = "delivered"  // sent: handed to a connection
	ruleInbox      = "inbox"      // sent: kept in the inbox
	ruleSuperseded = "superseded" // skipped: held for a first ping that said the user was there
	ruleCameBack   = "came-back"  // skipped: the user renewed after the deadline (the consumer's rule too)
	ruleTooOld     = "too-old"    // skipped: past guide-max-age (the consumer's rule too)
	ruleLost       = "lost"       // skipped: Redis refused to keep it (the gateway logs it as lost)
)

// deviceOf is what the timeline says a connection's device is: the
// client's device query parameter (the platform's name for the device,
// up to 64 letters, digits and ".:_-"; anything else refused), else its
// User-Agent, the first 80 of its printable ASCII characters; "" when
// neither says.
func deviceOf(r *http.Request) (string, error) {
	if d := r.URL.Query().Get("device"); d != "" {
		if len(d) > maxDevice {
			return "", fmt.Errorf("device: %d characters, want at most %d", len(d), maxDevice)
		}
		for _, c := range []byte(d) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(".:_-", c) >= 0) {
				return "", fmt.Errorf("device: %q, want letters, digits and \".:_-\" only", d)
			}
		}
		return d, nil
	}
	ua := make([]byte, 0, maxUserAgent)
	for _, c := range []byte(r.UserAgent()) {
		if len(ua) == maxUserAgent {
			break
		}
		if c >= 0x20 && c <= 0x7e {
			ua = append(ua, c)
		}
	}
	return string(ua), nil
}

// The longest device parameter taken, and the most of a User-Agent kept.
const (
	maxDevice    = 64
	maxUserAgent = 80
)

// startEntry is a connection's start: here is how many connections the
// user has on this gateway with it, res what the route write found.
func startEntry(segment string, here int, res session.RouteResult, held bool) timeline.Entry {
	e := timeline.Entry{Kind: timeline.KindStart, Segment: segment}
	switch {
	case res.Err != nil:
		e.Rule = ruleConnected
		e.Detail = fmt.Sprintf("connection %d of the user on this gateway; route not written yet", here)
	case res.Left <= 1:
		e.Rule = ruleStarted
		e.Detail = "the user's only connection"
	default:
		e.Rule = ruleJoined
		e.Detail = fmt.Sprintf("connection %d of the user on this gateway, %d on all", here, res.Left)
	}
	if held {
		e.Detail += "; guides held until its first ping"
	}
	return e
}

// endEntry is a connection's end: code is its close code (see endCode),
// ours whether the gateway closed it, normal whether it counts as the
// user leaving (1000, 4000), res what the route write that counted it
// out found.
func endEntry(segment string, code int, ours, normal bool, res session.RouteResult) timeline.Entry {
	e := timeline.Entry{Kind: timeline.KindEnd, Segment: segment, Code: code}
	switch {
	case res.Ended:
		e.Rule, e.Detail = ruleSessionEnded, "the last close: session ended, no guide follows"
	case normal && res.Err != nil:
		e.Rule, e.Detail = ruleNormal, "normal close; route not written yet, the session ends once it is if this was the last"
	case normal:
		e.Rule, e.Detail = ruleNormal, fmt.Sprintf("normal close; %d connections of the user left", res.Left)
	case ours:
		e.Rule, e.Detail = ruleByGateway, closeReason(code)
	default:
		e.Rule, e.Detail = ruleDropped, "dropped: the session runs out unless the user pings again"
	}
	return e
}

// closeReason says why the gateway closes with code.
func closeReason(code int) string {
	switch code {
	case websocket.CloseGoingAway:
		return "gateway shutting down: reconnect elsewhere"
	case websocket.CloseTryAgainLater:
		return "Redis out of reach: reconnect elsewhere"
	case websocket.ClosePolicyViolation:
		return "rate limit exceeded"
	case websocket.CloseUnsupportedData:
		return "a binary frame"
	case websocket.CloseInvalidFramePayloadData:
		return "a frame that is not a JSON object"
	case frame.CloseTokenExpired:
		return "token expired"
	case frame.CloseInactive:
		return "closed for inactivity"
	}
	return "closed by the gateway"
}

// turnEntry is a turn change an activity event made, via the endpoint or
// the topic; false for an event that changes no turn.
func turnEntry(kind activityKind, segment, via string) (timeline.Entry, bool) {
	e := timeline.Entry{Kind: timeline.KindTurn, Segment: segment}
	switch kind {
	case activityTurnUser:
		e.Rule, e.Detail = ruleTurnUser, "the user's turn, from the activity "+via
	case activityTurnUs:
		e.Rule, e.Detail = ruleTurnUs, "our turn, from the activity "+via
	case activityEnd:
		e.Rule, e.Detail = ruleTurnEnded, "the platform ended the conversation, from the activity "+via
	default:
		return timeline.Entry{}, false
	}
	return e, true
}

// closedEntry is a connection closed with 4000 after req, a close
// stage's guide.
func closedEntry(req push.Request) timeline.Entry {
	return timeline.Entry{Kind: timeline.KindClosed, Rule: ruleInactive, Code: frame.CloseInactive, Stage: req.Stage, Event: req.ID,
		Deadline: req.DeadlineMS, Segment: req.Segment, Detail: "close stage: the connection closed after its guide"}
}

// sentEntry is a guide the gateway handed on by itself, after the push
// that the consumer recorded: status is where it went, how says why.
func sentEntry(req push.Request, status push.Status, conns int, how string) (timeline.Entry, bool) {
	e := timeline.Entry{Kind: timeline.KindSent, Stage: req.Stage, Event: req.ID, Deadline: req.DeadlineMS, Segment: req.Segment, Detail: how}
	switch status {
	case push.Delivered:
		e.Rule, e.Conns = ruleDelivered, conns
	case push.Queued:
		e.Rule = ruleInbox
	default:
		return timeline.Entry{}, false
	}
	return e, true
}

// skippedEntry is a guide the gateway dropped after the consumer's
// "sent": rule and how say why.
func skippedEntry(req push.Request, rule, how string) timeline.Entry {
	return timeline.Entry{Kind: timeline.KindSkipped, Rule: rule, Event: req.ID, Stage: max(req.Stage, 1),
		Deadline: req.DeadlineMS, Segment: req.Segment, Detail: how}
}

// lostEntry is a guide the gateway could neither show nor keep.
func lostEntry(req push.Request, how string) timeline.Entry {
	return skippedEntry(req, ruleLost, how)
}

// recordDropped records raw, an inbox entry dropped, as skipped by rule.
func (g *Gateway) recordDropped(uid, raw, rule, how string) {
	if req, ok := parseEntry(raw); ok {
		g.timeline.Record(uid, skippedEntry(req, rule, how))
	}
}

// ackedEntry is a device's ack of guide id.
func ackedEntry(id string) timeline.Entry {
	return timeline.Entry{Kind: timeline.KindAcked, Event: id}
}

// supersededEntry is a guide dropped, not shown: the user's first ping
// after it said they were there after its deadline.
func supersededEntry(req push.Request) timeline.Entry {
	return timeline.Entry{Kind: timeline.KindSkipped, Rule: ruleSuperseded, Event: req.ID, Stage: max(req.Stage, 1),
		Deadline: req.DeadlineMS, Detail: "not shown: the user's first ping said they were there after the deadline"}
}
