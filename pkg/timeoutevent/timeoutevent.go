// Package timeoutevent is the schema of the event the expiry listener
// produces when a session runs out, and the guide consumer reads.
//
// The event is JSON, versioned by its "v" field. Its id is derived from the
// uid, the deadline and the stage, so it is the same whichever path (sweep
// or Redis expired event) and whichever listener replica saw the silence,
// and downstream can use it as an idempotency key.
//
// A silence goes through stages (see package policy): stage 1 at the
// deadline, each later one its delay after the one before, while the user
// stays silent. Each stage is its own event. Stage 1's id is the one
// events had before stages, so its consumers see no change.
package timeoutevent

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Version is the schema version this package writes, but for notify
// stages: VersionNotify. Builds before notify stages read v1 events with
// the actions remind and close only, and take any other version for a
// newer build's (ErrUnknownVersion): a listener rolled back produces its
// spooled notify stages as they are, rather than dropping them as
// corrupt, and an older consumer dead-letters them, where they are kept.
const (
	Version       = 1
	VersionNotify = 2
)

// Sources of a detection.
const (
	SourceSweep = "sweep" // the listener's sweep of the deadline index
	SourceEvent = "event" // a Redis expired keyspace event
)

// Actions of a stage.
const (
	// ActionRemind asks the user whether they are still there.
	ActionRemind = "remind"
	// ActionClose tells the user the chat is closed for inactivity; the
	// gateway closes their connections (4000) and the session ends. A
	// close stage is always the last.
	ActionClose = "close"
	// ActionNotify sends the user nothing: the guide consumer tells the
	// platform's notify webhook that the user went away (to send a
	// mobile push, mark them away, free an agent), with every guarantee
	// of a guide.
	ActionNotify = "notify"
)

// Reasons of a final stage: why the silence ends there, so that the
// platform can act.
const (
	// ReasonInactive: the last stage was a reminder; the user was asked
	// and stayed silent, and nothing more comes. The chat stays open.
	ReasonInactive = "inactive"
	// ReasonEnded: a close stage ended the chat.
	ReasonEnded = "ended"
	// ReasonNotify: the last stage was a notify; the user was told
	// nothing by it. The chat stays open.
	ReasonNotify = "notify"
)

// ReasonOf is the reason of a final stage of action.
func ReasonOf(action string) string {
	switch action {
	case ActionClose:
		return ReasonEnded
	case ActionNotify:
		return ReasonNotify
	}
	return ReasonInactive
}

// ValidAction reports whether action is one of a stage's actions.
func ValidAction(action string) bool {
	return action == ActionRemind || action == ActionClose || action == ActionNotify
}

// MaxStages bounds the stages of a silence.
const MaxStages = 10

// MaxTextLen bounds a stage's text, in bytes: the push endpoint's limit.
const MaxTextLen = 1024

// Event says that a user's session ran out without a renewal, and which
// stage of that silence is due.
type Event struct {
	Version    int    `json:"v"`
	ID         string `json:"id"`
	UID        string `json:"uid"`
	Segment    string `json:"segment"`
	DeadlineMS int64  `json:"deadline_ms"` // when the session ran out, Unix ms
	DetectedMS int64  `json:"detected_ms"` // when it was found gone, Unix ms, Redis clock
	Source     string `json:"source"`
	// Stage is the stage of the silence, from 1. Events of listeners
	// before stages carry none; Parse reads that as 1.
	Stage int `json:"stage"`
	// DueMS is when the stage was due: the deadline for stage 1, then
	// each stage's delay after the one before. Unix ms, Redis clock.
	DueMS int64 `json:"due_ms"`
	// Action is ActionRemind, ActionClose or ActionNotify.
	Action string `json:"action"`
	// Final is true on a close stage: the chat ends with it.
	Final bool `json:"final"`
	// Reason is set on the silence's last stage, none following it, and
	// only there: ReasonOf its action, why the silence ends there. (A
	// close stage is always the last; events of listeners before reasons
	// have none, and Parse gives a close stage its own.) The platform's
	// webhooks carry it, with final true.
	Reason string `json:"reason,omitempty"`
	// Text is the stage's text from the policy; empty means the
	// consumer's text for the segment.
	Text string `json:"text,omitempty"`
}

// New builds the event of stage 1, a reminder at the deadline, with its
// stable id.
func New(uid, segment string, deadline, detected time.Time, source string) Event {
	return Event{
		Version:    Version,
		ID:         ID(uid, deadline.UnixMilli()),
		UID:        uid,
		Segment:    segment,
		DeadlineMS: deadline.UnixMilli(),
		DetectedMS: detected.UnixMilli(),
		Source:     source,
		Stage:      1,
		DueMS:      deadline.UnixMilli(),
		Action:     ActionRemind,
	}
}

// AtStage makes e the event of stage, due at due, with action and text;
// last says that no stage follows it (a close stage never has one).
func (e Event) AtStage(stage int, due time.Time, action, text string, last bool) Event {
	e.Stage = stage
	e.DueMS = due.UnixMilli()
	e.Action = action
	e.Version = Version
	if action == ActionNotify {
		e.Version = VersionNotify
	}
	e.Final = action == ActionClose
	e.Reason = ""
	if last || e.Final {
		e.Reason = ReasonOf(action)
	}
	e.Text = text
	e.ID = StageID(e.UID, e.DeadlineMS, stage)
	return e
}

// ID is the id of uid's silence that ran out at deadlineMS, and of its
// first stage: 32 hex digits.
func ID(uid string, deadlineMS int64) string { return StageID(uid, deadlineMS, 1) }

// StageID is the id of a stage of uid's silence that ran out at
// deadlineMS. Stage 1's is ID's, as before stages.
func StageID(uid string, deadlineMS int64, stage int) string {
	// Hashed from a buffer on the stack when it fits, as every event is
	// checked against its id where it is parsed.
	var buf [96]byte
	b := append(buf[:0], "stillthere/timeout/v1\x00"...)
	b = append(b, uid...)
	b = append(b, 0)
	b = strconv.AppendInt(b, deadlineMS, 10)
	if stage > 1 {
		b = append(b, "\x00stage\x00"...)
		b = strconv.AppendInt(b, int64(stage), 10)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// Last reports whether no stage follows e in its silence.
func (e Event) Last() bool { return e.Reason != "" }

// Deadline is the event's deadline as a time.
func (e Event) Deadline() time.Time { return time.UnixMilli(e.DeadlineMS) }

// Marshal encodes the event: json.Marshal's bytes, written by hand when
// its strings are plain (codec.go).
func (e Event) Marshal() ([]byte, error) {
	if b, ok := marshalPlain(&e); ok {
		return b, nil
	}
	return json.Marshal(e)
}

// ErrUnknownVersion means the event has a version this build cannot read.
var ErrUnknownVersion = errors.New("unknown timeout event version")

var errNoVersion = errors.New("decode timeout event: no version field \"v\"")

// Parse decodes and checks an event. An error wrapping ErrUnknownVersion
// means a newer producer; any other error means a malformed record.
//
// A record in the plain form the listener writes is read by hand
// (codec.go); any other goes through encoding/json (parseJSON), with the
// same result.
func Parse(b []byte) (Event, error) {
	if e, ok := parsePlain(b); ok {
		if err := known(&e.Version); err != nil {
			return Event{}, err
		}
		return complete(e)
	}
	return parseJSON(b)
}

// parseJSON is Parse through encoding/json, for any record: what Parse
// did for every record before the plain form was read by hand. It decodes
// the record once. Only when that fails does it read the version alone,
// so that a newer producer's event, whose fields this build may not
// decode, is still told apart from a malformed one.
func parseJSON(b []byte) (Event, error) {
	// V is at a shallower depth than the embedded Event's field of the
	// same name, so it takes "v": a pointer, to tell a missing one.
	var w struct {
		Event
		V *int `json:"v"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		var head struct {
			V *int `json:"v"`
		}
		if herr := json.Unmarshal(b, &head); herr != nil {
			return Event{}, fmt.Errorf("decode timeout event: %w", herr)
		}
		if verr := known(head.V); verr != nil {
			return Event{}, verr
		}
		return Event{}, fmt.Errorf("decode timeout event: %w", err)
	}
	if err := known(w.V); err != nil {
		return Event{}, err
	}
	e := w.Event
	e.Version = *w.V
	return complete(e)
}

// known says why v, an event's version field (nil when it has none), is
// not one this build reads, or nil when it is.
func known(v *int) error {
	switch {
	case v == nil:
		return errNoVersion
	case *v != Version && *v != VersionNotify:
		return fmt.Errorf("%w: %d", ErrUnknownVersion, *v)
	}
	return nil
}

// complete gives a decoded event of a known version what events of older
// listeners lack, and checks it.
func complete(e Event) (Event, error) {
	// An event from before stages is stage 1's reminder.
	if e.Stage == 0 && e.Action == "" && !e.Final {
		e.Stage, e.Action = 1, ActionRemind
	}
	if e.DueMS == 0 && e.Stage == 1 {
		e.DueMS = e.DeadlineMS
	}
	// A close stage's event from before reasons has none.
	if e.Final && e.Action == ActionClose && e.Reason == "" {
		e.Reason = ReasonEnded
	}
	switch {
	case e.UID == "":
		return Event{}, errors.New("timeout event has no uid")
	case e.DeadlineMS <= 0:
		return Event{}, fmt.Errorf("timeout event for %q has no deadline", e.UID)
	case e.Stage < 1 || e.Stage > MaxStages:
		return Event{}, fmt.Errorf("timeout event for %q: stage %d, want 1-%d", e.UID, e.Stage, MaxStages)
	case (e.Version == VersionNotify) != (e.Action == ActionNotify):
		return Event{}, fmt.Errorf("timeout event for %q: v %d with action %q (v %d is a notify stage's, and only its)", e.UID, e.Version, e.Action, VersionNotify)
	case !ValidAction(e.Action):
		return Event{}, fmt.Errorf("timeout event for %q: action %q, want %q, %q or %q", e.UID, e.Action, ActionRemind, ActionClose, ActionNotify)
	case e.Final != (e.Action == ActionClose):
		return Event{}, fmt.Errorf("timeout event for %q: final %v with action %q (final is true on a close stage only)", e.UID, e.Final, e.Action)
	case e.Reason != "" && e.Reason != ReasonOf(e.Action):
		return Event{}, fmt.Errorf("timeout event for %q: %s stage with reason %q, want %q (on the last stage) or none", e.UID, e.Action, e.Reason, ReasonOf(e.Action))
	case e.Action == ActionNotify && e.Text != "":
		return Event{}, fmt.Errorf("timeout event for %q: a notify stage with a text (it sends the user nothing)", e.UID)
	case e.DueMS < e.DeadlineMS:
		return Event{}, fmt.Errorf("timeout event for %q: due_ms %d before deadline_ms %d", e.UID, e.DueMS, e.DeadlineMS)
	case len(e.Text) > MaxTextLen:
		return Event{}, fmt.Errorf("timeout event for %q: text of %d bytes, want at most %d", e.UID, len(e.Text), MaxTextLen)
	case e.ID != StageID(e.UID, e.DeadlineMS, e.Stage):
		return Event{}, fmt.Errorf("timeout event for %q: id %q does not match uid, deadline and stage", e.UID, e.ID)
	}
	return e, nil
}
