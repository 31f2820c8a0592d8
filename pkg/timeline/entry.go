// Package timeline records, for each user, what stillthere decided about
// them and why, and reads it back for the platform's support team: "why
// was I asked whether I was still there while I was typing?", "why did
// nobody nudge this user?". Every service appends the decisions it makes
// (a Recorder); Redis stamps each entry with its clock, the clock every
// deadline is on; a timeline keeps the last Bounds.Entries entries of the
// last Bounds.Keep. Entries are diagnostics: recording one never holds
// up the decision, and under overload one may be dropped (counted), never
// a guide.
package timeline

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// Kind is what happened.
type Kind string

// The kinds, in the order a silence meets them.
const (
	KindStart     Kind = "start"     // a device connected: session started or joined
	KindEnd       Kind = "end"       // a device's connection ended (Code), or the platform ended the conversation
	KindTurn      Kind = "turn"      // whose turn it is changed (Rule: user, us, ended)
	KindLapse     Kind = "lapse"     // a deadline passed and the listener found it
	KindHeld      Kind = "held"      // a lapse held (Rule), until Until, with the blind interval when one holds it
	KindRechecked Kind = "rechecked" // a held lapse judged again at its release, or its hold cancelled before it (InScript)
	KindStale     Kind = "stale"     // a lapse a renewal or an end had overtaken (Rule and Detail say which)
	KindGranted   Kind = "granted"   // a renewal that ended a silence between its stages (Rule stages-cancelled; InScript), or the last one, read with the timeline (Rule last; Current)
	KindDeduped   Kind = "deduped"   // a lapse already produced, spooled or claimed elsewhere: nothing sent again
	KindDeferred  Kind = "deferred"  // a second silence in a minute window: held to the window's end
	KindProduced  Kind = "produced"  // its timeout event went to Kafka (Event, Stage)
	KindSpooled   Kind = "spooled"   // its timeout event went to the listener's spool while Kafka was out of reach
	KindReplayed  Kind = "replayed"  // a spooled event went to Kafka
	KindSent      Kind = "sent"      // the guide was handed over (Rule: delivered to Conns connections, inbox, webhook)
	KindSkipped   Kind = "skipped"   // the consumer sent nothing (Rule: the user came back, too old)
	KindDead      Kind = "dead-lettered"
	KindAcked     Kind = "acked" // a device acknowledged the guide
	KindClosed    Kind = "closed"

	KindUnreadable Kind = "unreadable" // a stored entry that does not decode (read only)
)

// Entry is one decision about one user.
type Entry struct {
	// At is when it was recorded, by Redis's clock; set on reading.
	At       time.Time `json:"-"`
	Service  string    `json:"service"`
	Instance string    `json:"instance,omitempty"`
	Kind     Kind      `json:"kind"`
	// Rule is the rule or outcome, from a small fixed set per kind (a
	// hold rule, a delivery route): metrics count entries by kind and rule.
	Rule string `json:"rule,omitempty"`
	// Detail says the rest, for a person.
	Detail   string   `json:"detail,omitempty"`
	Segment  string   `json:"segment,omitempty"`
	Stage    int      `json:"stage,omitempty"`
	Event    string   `json:"event,omitempty"`       // the timeout event's id
	Deadline int64    `json:"deadline_ms,omitempty"` // the deadline the silence ran from, Redis ms
	Until    int64    `json:"until_ms,omitempty"`    // held until, Redis ms
	BlindMS  [2]int64 `json:"blind_ms,omitzero"`     // the blind interval that held it, Redis ms
	Conns    int      `json:"conns,omitempty"`
	Device   string   `json:"device,omitempty"` // a start's device: the client's device parameter, else its User-Agent
	Code     int      `json:"code,omitempty"`   // a close code, or the webhook's status
	// InScript: recorded by the Redis script that carried the decision
	// out, in the same step (session.HoldNotes), not queued by a
	// Recorder: At is when the script ran.
	InScript bool `json:"in_script,omitempty"`
	// Current: not recorded, but read with the timeline from the user's
	// session as it is now (RuleLast).
	Current bool `json:"current,omitempty"`
	// Found folds in the entry of the finding this one follows from
	// (KindLapse or KindRechecked), made FoundMS before it: one write
	// for the two that most silences meet in one step of the listener
	// (a lapse and its event produced, a lapse and its hold). Stored
	// only: reading unfolds it into its two entries (unfold).
	Found   Kind  `json:"found,omitempty"`
	FoundMS int64 `json:"found_ms,omitempty"`
}

// Fold returns e with the finding found folded in, made at foundAt, e at
// at: one stored entry that reads as two (see Entry.Found).
func Fold(e Entry, found Kind, foundAt, at time.Time) Entry {
	e.Found, e.FoundMS = found, max(0, at.Sub(foundAt).Milliseconds())
	return e
}

// unfold appends to dst the entries e stands for: the finding it folds
// in, with e's silence, service and instance, then e itself.
func unfold(dst []Entry, e Entry) []Entry {
	if e.Found == "" {
		return append(dst, e)
	}
	f := Entry{
		At: e.At.Add(-time.Duration(e.FoundMS) * time.Millisecond), Service: e.Service, Instance: e.Instance,
		Kind: e.Found, Segment: e.Segment, Stage: e.Stage, Deadline: e.Deadline,
	}
	e.Found, e.FoundMS = "", 0
	return append(dst, f, e)
}

// Rules of the stale entries a renewal or an end records when it cancels
// a held timeout (Settings.HoldNotes). The session package's scripts
// write them, and their kinds, from words of its own: TestHoldNotesRead
// reads them back as these.
const (
	RuleRenewed = "renewed" // a grant: a renewal, an activity event
	RuleEnded   = "ended"   // an end: a last close, the platform's end of the conversation
	// RuleStagesCancelled: a KindGranted entry, a grant (a renewal, an
	// activity event, a turn) between the stages of a silence: Stage (due
	// next) and the rest of the silence's stages are cancelled; Deadline
	// is the silence's.
	RuleStagesCancelled = "stages-cancelled"
	// RuleLast: a KindGranted entry read with the timeline (Current), not
	// recorded: the user's last renewal or end, and the deadline pending.
	RuleLast = "last"
)

// MarshalJSON writes the entry with its time, as the API answers it.
func (e Entry) MarshalJSON() ([]byte, error) {
	type plain Entry
	return json.Marshal(struct {
		AtMS int64  `json:"at_ms"`
		At   string `json:"at"`
		plain
	}{e.At.UnixMilli(), e.At.UTC().Format(time.RFC3339Nano), plain(e)})
}

// encode is the entry as stored, without its time (Redis stamps it).
func (e Entry) encode() (string, error) {
	type plain Entry
	b, err := json.Marshal(plain(e))
	return string(b), err
}

// decode reads a stored entry.
func decode(s session.TimelineEntry) (Entry, error) {
	if s.Err != nil {
		return Entry{}, s.Err
	}
	var e Entry
	if err := json.Unmarshal([]byte(s.Entry), &e); err != nil {
		return Entry{}, fmt.Errorf("timeline entry %q: %w", s.Entry, err)
	}
	if e.Kind == "" {
		return Entry{}, fmt.Errorf("timeline entry %q: no kind", s.Entry)
	}
	e.At = s.At
	return e, nil
}
