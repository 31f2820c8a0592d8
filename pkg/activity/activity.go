// Package activity is the contract of the activity a chat platform's own
// servers report about their users: the events, their limits, the secret
// rule, and a strict parser. The gateway's POST /v1/activity takes a
// batch of them ({"events": [...]}, ParseBatch); a Kafka record carries
// one (ParseEvent). docs/protocol.md describes the wire.
//
// Strict, unlike the push call: a platform is not a service of ours
// rolled out in step with the gateway, so a field this version does not
// know is refused, not ignored, and the platform learns at once that the
// gateway does not do what it asked. So are duplicate keys, values of the
// wrong JSON type (null included), trailing data and invalid UTF-8.
package activity

import (
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
)

// Path is where the gateway's internal listener serves the endpoint.
const Path = "/v1/activity"

// Limits of the contract.
const (
	// MaxEvents bounds a batch.
	MaxEvents = 1000
	// MaxBodyBytes bounds a batch's body: MaxEvents events of about 1 KiB
	// each. The longest event without escapes is under 500 bytes (a uid
	// of 128, an id of 128, a segment of 64, two 13-digit times and the
	// keys); the rest is room for whitespace and escaped characters.
	MaxBodyBytes = 1 << 20
	// MaxRecordBytes bounds one event on its own (a Kafka record): room
	// for the longest event with every character of its id escaped.
	MaxRecordBytes = 4 << 10
	// MaxIDLen bounds an event's id, in bytes.
	MaxIDLen = 128
	// MaxHold bounds max_ms: the longest a turn to us holds a user's clock.
	MaxHold = 24 * time.Hour
	// MaxAhead is how far past the receiver's clock an at_ms may be:
	// clocks differ, but not by a day.
	MaxAhead = 24 * time.Hour
	// MinSecretLen is the shortest activity secret the gateway accepts.
	MinSecretLen = 32
)

// minAtMS is the earliest at_ms accepted, 2020-01-01T00:00:00Z: an older
// one is seconds taken for milliseconds, or a zero filled in by mistake.
var minAtMS = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

// Kind is what happened.
type Kind string

const (
	// Active: the user did something (wrote, typed); renews like a ping.
	Active Kind = "active"
	// Turn: the turn in the conversation passed (see To).
	Turn Kind = "turn"
	// End: the conversation is over; the session ends.
	End Kind = "end"
)

// To is whose turn it is after a Turn.
type To string

const (
	// ToUser: we spoke; the user's clock runs from now.
	ToUser To = "user"
	// ToUs: the user waits for us; their clock holds until the next turn
	// to them, or MaxMS.
	ToUs To = "us"
)

// Event is one piece of activity. Its JSON is its wire form: Marshal an
// accepted event and it parses back the same.
type Event struct {
	// UID is the user: 1-128 characters of [A-Za-z0-9._:@-]. Required.
	UID string `json:"uid"`
	// Kind is required.
	Kind Kind `json:"kind"`
	// To is required with Turn, and refused with the other kinds.
	To To `json:"to,omitempty"`
	// Seg is the user's segment; empty: their current one, else the
	// default segment.
	Seg string `json:"seg,omitempty"`
	// AtMS is when it happened, Unix ms; 0 (absent): when received. An
	// event older than the user's state it would change changes nothing.
	AtMS int64 `json:"at_ms,omitempty"`
	// MaxMS bounds a turn to us, 1 ms to 24 h: after it, the clock runs as
	// if the turn had passed to the user. Only with a turn to us.
	MaxMS int64 `json:"max_ms,omitempty"`
	// ID is the platform's name for the event, for its logs and ours:
	// 1-128 bytes, printable.
	ID string `json:"id,omitempty"`
}

// At is AtMS as a time, or the zero time when absent.
func (e Event) At() time.Time {
	if e.AtMS == 0 {
		return time.Time{}
	}
	return time.UnixMilli(e.AtMS)
}

// MaxHoldFor is MaxMS as a duration, 0 when absent.
func (e Event) MaxHoldFor() time.Duration { return time.Duration(e.MaxMS) * time.Millisecond }

// FieldError says why a batch or an event was refused.
type FieldError struct {
	// Index is the event's position in its batch, from 0; -1 when the
	// error is not about one event of a batch (the batch itself, or an
	// event parsed alone).
	Index int
	// Field is the JSON field ("uid", "to", "events"), or "" when the
	// error is about the JSON as a whole.
	Field string
	// Reason says what was wanted.
	Reason string
}

func (e *FieldError) Error() string {
	var s string
	if e.Index >= 0 {
		s = "events[" + strconv.Itoa(e.Index) + "]"
		if e.Field != "" {
			s += "."
		}
	}
	s += e.Field
	if s == "" {
		return e.Reason
	}
	return s + ": " + e.Reason
}

// ErrTooManyEvents is the error of a batch of more than MaxEvents events:
// the gateway answers it 413, as a body past MaxBodyBytes.
var ErrTooManyEvents = fmt.Errorf("events: more than %d", MaxEvents)

// CheckSecret applies the secret rule to the gateway's activity-secret:
// empty (the endpoint is off), or at least MinSecretLen bytes and not the
// push secret, so that a platform holding one cannot push guides.
func CheckSecret(secret, pushSecret string) error {
	switch {
	case secret == "":
		return nil
	case len(secret) < MinSecretLen:
		return fmt.Errorf("activity-secret: %d bytes, want at least %d (or empty: no activity endpoint)", len(secret), MinSecretLen)
	case secret == pushSecret:
		return errors.New("activity-secret: the same as push-secret, want a secret of its own: the platform holding it must not be able to push guides")
	}
	return nil
}

// checkAtMS checks an at_ms against now.
func checkAtMS(ms int64, now time.Time) string {
	switch {
	case ms < minAtMS:
		return fmt.Sprintf("%d, want Unix milliseconds from 2020 on", ms)
	case ms > now.Add(MaxAhead).UnixMilli():
		return fmt.Sprintf("%d, more than %v ahead of this server's clock", ms, MaxAhead)
	}
	return ""
}

// checkID checks an id: 1-MaxIDLen bytes of printable characters.
func checkID(id string) string {
	if id == "" || len(id) > MaxIDLen {
		return fmt.Sprintf("want 1-%d bytes", MaxIDLen)
	}
	for _, r := range id {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return "want printable characters"
		}
	}
	return ""
}

// Response is the body of a 200 answer: the batch was applied, in order.
type Response struct {
	// Applied counts the events that changed their user's state.
	Applied int `json:"applied"`
	// Stale counts those older than the user's state they would have
	// changed (by at_ms, or by order per user), which changed nothing.
	Stale int `json:"stale"`
}

// ErrorResponse is the body of every other answer but 404. Nothing of
// the batch was applied.
type ErrorResponse struct {
	Error string `json:"error"`
	// Index is the refused event's position in the batch, with a 400
	// about one event.
	Index *int `json:"index,omitempty"`
	// Field is the refused field, when the error is about one.
	Field string `json:"field,omitempty"`
}
