// Package push is the contract between the guide consumer and the
// gateway's push endpoint, POST /v1/push: the request, the statuses it is
// answered with, the limits, the secret rule, and the client the consumer
// calls it with. The gateway's handler and the consumer's sender both use
// this package, so the compiler checks the one service-to-service HTTP
// contract. It sits beside frame (client to gateway) and timeoutevent
// (listener to consumer); docs/protocol.md describes the wire.
//
// Compatibility. Fields are added, never renamed or removed. The handler
// ignores fields it does not know, so a field added consumer-first reaches
// older gateways harmlessly. Gateways before this package refused unknown
// fields with a 400 "json: unknown field": the client reads that answer as
// version skew and retries, so guides wait for the gateways to be
// upgraded rather than being dead-lettered. New statuses (stale, too_old)
// are answered only to requests that carry deadline_ms, which only
// consumers that know them send.
package push

import (
	"cmp"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/userid"
)

// Path is where the gateway's internal listener serves the endpoint.
const Path = "/v1/push"

// Defaults both sides of the call share.
const (
	// DefaultAddr is the gateway's internal listener (push-addr), which
	// the consumer's push-url names by default.
	DefaultAddr = "127.0.0.1:8081"
	// DefaultGuideMaxAge is guide-max-age: how long after its deadline a
	// guide may still go out. The consumer drops older events; the
	// gateway hands over no older guide from an inbox.
	DefaultGuideMaxAge = 5 * time.Minute
)

// Limits of a request.
const (
	// MaxIDLen bounds a guide id; the listener's are 32 hex digits. A
	// client acks a guide by its id, so the bound is the ack frame's.
	MaxIDLen = frame.MaxIDLen
	// MaxTextLen bounds a guide's text, in bytes.
	MaxTextLen = timeoutevent.MaxTextLen
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes = 16 << 10
	// MinSecretLen is the shortest push secret either side accepts.
	MinSecretLen = 32
)

// Request is the body of POST /v1/push.
type Request struct {
	// ID is the guide's id, the same for every send of one silence: the
	// gateway delivers each id to a user once.
	ID string `json:"id"`
	// UID is the user to guide: 1-128 characters of [A-Za-z0-9._:@-].
	UID string `json:"uid"`
	// Segment is the user's segment, optional.
	Segment string `json:"segment,omitempty"`
	// Text is the guide's text, 1-MaxTextLen bytes.
	Text string `json:"text"`
	// DeadlineMS is when the session ran out, Unix ms by Redis's clock;
	// 0 when unknown (an older consumer). With it, the gateway drops a
	// guide whose user renewed since (Stale), and its inbox keeps the
	// guide until the deadline plus the guide max age.
	DeadlineMS int64 `json:"deadline_ms,omitempty"`
	// DueMS is when this stage was due, Unix ms by Redis's clock: the
	// deadline for stage 1; 0 when unknown (an older consumer).
	DueMS int64 `json:"due_ms,omitempty"`
	// DetectedMS is when the expiry listener found the silence due, Unix
	// ms by Redis's clock; 0 when unknown (an older consumer). A silence
	// held through an outage, or restored after Redis lost it, is found
	// long after its deadline: a stage 1's inbox max age counts from the
	// later of the two, as the consumer's own age check does, so that an
	// outage never ages out the guide it only delayed.
	DetectedMS int64 `json:"detected_ms,omitempty"`
	// Stage is the stage of the silence this guide belongs to, from 1
	// (see timeoutevent); 0, from an older consumer, means 1.
	Stage int `json:"stage,omitempty"`
	// Action is the stage's: "remind" ("" from an older consumer), or
	// "close", with Final.
	Action string `json:"action,omitempty"`
	// Final is true on a close stage: after the guide's frame the
	// gateway closes the user's connections with 4000 ("inactive") and
	// ends the session.
	Final bool `json:"final,omitempty"`
	// Reason is set on the silence's last stage only (see timeoutevent):
	// "inactive" on a reminder, "ended" on a close stage. The gateway
	// needs nothing of it; a webhook receiver gets it.
	Reason string `json:"reason,omitempty"`
	// CheckedMS is when a gateway last found this silence not over (its
	// user had not renewed since the deadline), Unix ms by Redis's clock
	// as that gateway reads it. Gateways set it for one another, on a
	// guide routed between them or kept in an inbox; a consumer's is
	// ignored.
	CheckedMS int64 `json:"checked_ms,omitempty"`
}

// Validate checks the limits, naming the first bad field.
func (r Request) Validate() error {
	switch {
	case r.ID == "" || len(r.ID) > MaxIDLen:
		return fmt.Errorf("id: want 1-%d characters", MaxIDLen)
	case !userid.Valid(r.UID):
		return errors.New("uid: want 1-128 characters of [A-Za-z0-9._:@-]")
	case r.Segment != "" && !userid.ValidSegment(r.Segment):
		return errors.New("segment: want 1-64 characters of [A-Za-z0-9._-]")
	case r.Text == "" || len(r.Text) > MaxTextLen:
		return fmt.Errorf("text: want 1-%d bytes", MaxTextLen)
	case r.DeadlineMS < 0:
		return fmt.Errorf("deadline_ms: %d, want 0 (unknown) or more", r.DeadlineMS)
	case r.DueMS < 0 || (r.DueMS > 0 && r.DueMS < r.DeadlineMS):
		return fmt.Errorf("due_ms: %d, want 0 (unknown) or at least deadline_ms", r.DueMS)
	case r.DetectedMS < 0:
		return fmt.Errorf("detected_ms: %d, want 0 (unknown) or more", r.DetectedMS)
	case r.CheckedMS < 0:
		return fmt.Errorf("checked_ms: %d, want 0 (never) or more", r.CheckedMS)
	case r.Stage < 0 || r.Stage > timeoutevent.MaxStages:
		return fmt.Errorf("stage: %d, want 1-%d (0 means 1)", r.Stage, timeoutevent.MaxStages)
	case r.Action != "" && r.Action != timeoutevent.ActionRemind && r.Action != timeoutevent.ActionClose:
		return fmt.Errorf("action: %q, want %q or %q", r.Action, timeoutevent.ActionRemind, timeoutevent.ActionClose)
	case r.Final != (r.Action == timeoutevent.ActionClose):
		return fmt.Errorf("final: %v with action %q, want true exactly on a close stage", r.Final, r.Action)
	case r.Reason != "" && r.Reason != timeoutevent.ReasonOf(cmp.Or(r.Action, timeoutevent.ActionRemind)):
		return fmt.Errorf("reason: %q with action %q, want %q on the last stage, else none", r.Reason, r.Action, timeoutevent.ReasonOf(cmp.Or(r.Action, timeoutevent.ActionRemind)))
	}
	return nil
}

// ParseRequest decodes and validates a request body. Unknown fields are
// ignored (see the package doc); a body that is not one JSON object, a
// field of the wrong type, or a value outside the limits is an error,
// which the handler answers with 400 (Rejected).
func ParseRequest(b []byte) (Request, error) {
	var r Request
	if err := json.Unmarshal(b, &r); err != nil {
		return Request{}, fmt.Errorf("body: %w", err)
	}
	if err := r.Validate(); err != nil {
		return Request{}, err
	}
	return r, nil
}

// Status is how a push was answered, in the response's "status".
type Status string

// Settled statuses, answered with 200: the consumer is done with the guide.
const (
	// Delivered: handed to the user's connections, on this or other
	// gateway instances (Response.Connections of them).
	Delivered Status = "delivered"
	// Queued: the user has no connection anywhere; kept in their inbox
	// for their next connect.
	Queued Status = "queued"
	// Duplicate: this id was delivered or queued for this user before.
	Duplicate Status = "duplicate"
	// Stale: the user renewed their session after the guide's deadline;
	// that silence is over, nothing was sent. Only with deadline_ms.
	Stale Status = "stale"
	// TooOld: the user has no connection and the guide is past its max
	// age, counted from its deadline; nothing was kept. Only with
	// deadline_ms.
	TooOld Status = "too_old"
)

// Unsettled statuses: the guide is not done.
const (
	// Retry: not now. 409 while another push of the same id is under way
	// (its outcome is not known yet, so it is not a duplicate), 503 while
	// Redis or the instance holding the user cannot be reached. Both
	// carry Retry-After. The consumer retries.
	Retry Status = "retry"
	// Rejected: 400, the request breaks the contract; retrying cannot
	// help. The consumer dead-letters the guide.
	Rejected Status = "rejected"
)

// Settled reports whether s ends the consumer's work on a guide.
func (s Status) Settled() bool {
	switch s {
	case Delivered, Queued, Duplicate, Stale, TooOld:
		return true
	}
	return false
}

// Response is the body of every answer but 401.
type Response struct {
	Status      Status `json:"status"`
	Connections int    `json:"connections"`
	// Error says why, with Retry and Rejected.
	Error string `json:"error,omitempty"`
}

// CheckSecret applies the secret rule: at least MinSecretLen bytes. The
// error names the setting both services call it by.
func CheckSecret(secret string) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("push-secret: %d bytes, want at least %d", len(secret), MinSecretLen)
	}
	return nil
}

// Authorized reports whether r carries secret as its bearer token, in
// constant time. Only the Authorization header counts: a secret in a
// query string would end up in logs.
func Authorized(r *http.Request, secret string) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || secret == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(secret)) == 1
}
