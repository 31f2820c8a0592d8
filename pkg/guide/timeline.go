package guide

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"
	"unicode/utf8"

	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// What the consumer adds to a user's timeline once it has settled one of
// their timeout events: what it sent, or why it sent nothing. The entries
// are decided here, from the settlement's facts, and recorded by process
// once the outcome has taken effect (the guide sent, the dead letter
// produced).
//
// One owner per fact. The consumer records every settlement it makes:
// sent, skipped, dead-lettered. A close stage's "closed" is recorded by
// whoever applies the close: the gateway, at each connection it closes
// with 4000 after the guide; the consumer when nobody connected applies
// it (the guide kept in the inbox, told at the next connect) or the
// platform does (the webhook). The gateway records what follows a push
// that only it sees: the inbox handed over on a connect, a routed guide
// whose connection had gone.

// Rules of the consumer's entries: a small fixed set, as the metric's
// rule label.
const (
	RuleDelivered = "delivered"        // sent: handed to Conns connections
	RuleInbox     = "inbox"            // sent: kept in the user's inbox for their next connect; closed: the same, for a close stage
	RuleWebhook   = "webhook"          // sent: the platform's webhook took it (Code); closed: the platform closes the chat
	RuleNotify    = "notify"           // sent: a notify stage, which the platform's notify webhook took (Code); the user was sent nothing
	RuleCameBack  = "came-back"        // skipped: the user's session is live again
	RuleEnded     = "renewed-or-ended" // skipped: the session was renewed or ended after the deadline, and is over now
	RuleTooOld    = "too-old"          // skipped: confirmed longer ago than guide-max-age
	RuleDuplicate = "duplicate"        // sent: the gateway had delivered or kept this guide from an earlier send
	RuleRejected  = "rejected"         // dead-lettered: the downstream refused the guide for good (Code)
	RuleInvalid   = "invalid"          // dead-lettered: not a timeout event this build reads
)

// settlement is how one timeout event was settled, with the facts its
// timeline entries tell.
type settlement struct {
	ev      timeoutevent.Event
	sender  string  // SenderGateway or SenderWebhook
	outcome Outcome // OutcomeInvalid has no ev but its user
	// needless: the consumer's own session check settled it (stale, too
	// old), with check and maxAge; else the downstream's answer did.
	needless bool
	// unasked: a close dropped because its silence's reminder was too
	// old to send (see unasked).
	unasked bool
	check   sessionCheck
	maxAge  time.Duration
	sent    Sent
	reason  string // a dead letter's
	code    int    // a dead letter's HTTP status, 0 if none
}

// entries is what s adds to its user's timeline, in order.
func (s settlement) entries() []timeline.Entry {
	base := timeline.Entry{Stage: s.ev.Stage, Event: s.ev.ID, Deadline: s.ev.DeadlineMS, Segment: s.ev.Segment}
	with := func(kind timeline.Kind, rule, detail string) timeline.Entry {
		e := base
		e.Kind, e.Rule, e.Detail = kind, rule, detail
		return e
	}
	switch s.outcome {
	case OutcomeDelivered, OutcomeQueued:
		e := with(timeline.KindSent, RuleDelivered, "")
		switch {
		case s.ev.Action == timeoutevent.ActionNotify:
			e.Rule, e.Code, e.Detail = RuleNotify, s.sent.Code, "the platform was told; the user was sent nothing"
			if s.ev.Last() {
				e.Detail += "; the last stage (reason " + s.ev.Reason + ")"
			}
		case s.sender == SenderWebhook:
			e.Rule, e.Code = RuleWebhook, s.sent.Code
		case s.outcome == OutcomeQueued:
			e.Rule, e.Detail = RuleInbox, "connected nowhere: kept for the next connect"
		default:
			e.Conns = s.sent.Conns
		}
		out := []timeline.Entry{e}
		if s.ev.Final {
			// The gateway records the close of each connection it
			// applies it to; these two it never applies.
			switch {
			case s.sender == SenderWebhook:
				out = append(out, with(timeline.KindClosed, RuleWebhook, "close stage: the platform closes the chat"))
			case s.outcome == OutcomeQueued:
				out = append(out, with(timeline.KindClosed, RuleInbox, "close stage: the user is told at their next connect"))
			}
		}
		return out
	case OutcomeStale:
		rule, detail := RuleCameBack, "the gateway found a renewal after the deadline"
		if s.needless {
			rule, detail = cameBack(s.check)
		}
		return []timeline.Entry{with(timeline.KindSkipped, rule, detail)}
	case OutcomeTooOld:
		detail := "the gateway: connected nowhere, and too old for the inbox"
		switch {
		case s.unasked:
			detail = "a close of a silence whose reminder was too old to send: the user was never asked"
		case s.needless:
			confirmed := time.UnixMilli(max(s.ev.DeadlineMS, s.ev.DetectedMS, s.ev.DueMS))
			detail = fmt.Sprintf("confirmed %v before the check, past guide-max-age %v", s.check.now.Sub(confirmed).Round(time.Millisecond), s.maxAge)
		}
		return []timeline.Entry{with(timeline.KindSkipped, RuleTooOld, detail)}
	case OutcomeDuplicate:
		// An earlier send of it went through, though its answer did not
		// reach the consumer (it timed out here): sent, then.
		return []timeline.Entry{with(timeline.KindSent, RuleDuplicate, "the gateway had delivered or kept it from an earlier send, whose answer did not reach the consumer")}
	case OutcomeRejected:
		e := with(timeline.KindDead, RuleRejected, clip(s.reason))
		e.Code = s.code
		return []timeline.Entry{e}
	case OutcomeInvalid:
		return []timeline.Entry{{Kind: timeline.KindDead, Rule: RuleInvalid, Detail: clip(s.reason)}}
	}
	return nil
}

// cameBack says how the session check found the silence over: the user
// back, or a renewal or an end after the deadline (the check cannot tell
// a user who came back and left from a conversation the platform ended).
func cameBack(c sessionCheck) (rule, detail string) {
	if c.live {
		return RuleCameBack, "the session is live: the user came back"
	}
	return RuleEnded, "renewed or ended after the deadline, at " + c.renewed.UTC().Format("15:04:05.000") +
		" UTC (Redis's clock): the user came back and left, or the conversation ended"
}

// maxDetail bounds a reason copied into an entry: an error from a
// downstream may quote a long body.
const maxDetail = 200

func clip(s string) string {
	if len(s) <= maxDetail {
		return s
	}
	n := maxDetail
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// newInstanceName names this consumer in the timeline entries it records:
// its host's name (a pod's, in Kubernetes) and a random suffix, as a
// gateway names itself. The group's member id changes with each join.
func newInstanceName() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "consumer"
	}
	var b [4]byte
	rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}
