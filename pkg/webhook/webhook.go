// Package webhook is the contract between the guide consumer and a
// platform's webhooks, the guide webhook (sender=webhook) and the notify
// webhook (notify stages): the body the consumer POSTs,
// its headers, which answers settle a guide, and the signature, with the
// function a Go receiver verifies it with. The consumer's sender and the
// test receiver both use this package; docs/protocol.md describes the
// wire for receivers in any language.
//
// The signature is timestamped so that a captured request cannot be
// replayed: X-Stillthere-Signature is "t=<unix seconds>,v1=<hex>", the hex
// being the HMAC-SHA256, under the webhook secret, of the timestamp, a dot
// and the raw body. A receiver refuses a timestamp further than Tolerance
// from its clock; within it, a replay carries a guide id the receiver has
// shown already, and it shows each id once. A header may carry several v1
// values, one per secret it was signed with, and verifies if any matches
// a secret the receiver holds. The consumer signs with its one secret, so
// a rotation is staged at the receiver: accept the old and the new secret
// (Verify takes several), switch the consumer, then drop the old one.
package webhook

import "net/http"

// Request headers.
const (
	// HeaderIdempotencyKey carries the guide id: the same for every send
	// of one silence, so the receiver shows it once.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderSignature is the signature, see Sign and Verify.
	HeaderSignature = "X-Stillthere-Signature"
)

// Body is the JSON a webhook receives.
type Body struct {
	// ID is the timeout event's id, also in HeaderIdempotencyKey.
	ID string `json:"id"`
	// UID and Segment are the user and their segment.
	UID     string `json:"uid"`
	Segment string `json:"segment"`
	// Text is the guide's text, from the segment's template or the
	// default.
	Text string `json:"text"`
	// DeadlineMS is when the session ran out, Unix ms by Redis's clock.
	DeadlineMS int64 `json:"deadline_ms"`
	// DueMS is when this stage was due, Unix ms by Redis's clock: the
	// deadline for stage 1, then each stage's delay after the one before.
	DueMS int64 `json:"due_ms"`
	// Stage is the stage of the silence, from 1. Action is "remind",
	// "close" (the chat is over: a chat backend closes the
	// conversation), or "notify" (the user was sent nothing, and Text is
	// empty: the user went away, for the platform to act on).
	Stage  int    `json:"stage"`
	Action string `json:"action"`
	// Final is true on the silence's last stage: no further stage of it
	// follows. Reason, set exactly then, says how it ended: "inactive"
	// (a last reminder: asked, and still silent; the chat stays open),
	// "ended" (a close stage ended the chat), "notify" (a last notify
	// stage; the chat stays open).
	Final  bool   `json:"final"`
	Reason string `json:"reason,omitempty"`
}

// Final reports whether code, a receiver's answer, refuses the guide for
// good: 400, 404, 410 or 422 say the guide itself is wrong, or its user
// unknown or gone, so the consumer dead-letters it. Any 2xx delivers it.
// Every other answer is the receiver failing, to be retried: 401 and 403
// above all, which a rotated secret or a blocked consumer gets for every
// guide, so they must hold guides (the breaker opens, fetching pauses)
// rather than dead-letter them all; also 408, 409, 429, 5xx and
// redirects. The push endpoint's answers are read the same way (package
// push), except that there only 400 is final: the gateway answers nothing
// else about a guide, and a 404 from it is a wrong URL, to be fixed and
// retried rather than dead-lettered.
func Final(code int) bool {
	switch code {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusGone, http.StatusUnprocessableEntity:
		return true
	}
	return false
}
