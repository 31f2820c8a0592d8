// Package timeoutevent is the schema of the event the expiry listener
// produces when a session runs out, and the guide consumer reads.
//
// The event is JSON, versioned by its "v" field. Its id is derived from the
// uid and the deadline, so it is the same whichever path (sweep or Redis
// expired event) and whichever listener replica saw the silence, and
// downstream can use it as an idempotency key.
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

// Version is the schema version this package writes.
const Version = 1

// Sources of a detection.
const (
	SourceSweep = "sweep" // the listener's sweep of the deadline index
	SourceEvent = "event" // a Redis expired keyspace event
)

// Event says that a user's session ran out without a renewal.
type Event struct {
	Version    int    `json:"v"`
	ID         string `json:"id"`
	UID        string `json:"uid"`
	Segment    string `json:"segment"`
	DeadlineMS int64  `json:"deadline_ms"` // when the session ran out, Unix ms
	DetectedMS int64  `json:"detected_ms"` // when it was found gone, Unix ms, Redis clock
	Source     string `json:"source"`
}

// New builds a version 1 event with its stable id.
func New(uid, segment string, deadline, detected time.Time, source string) Event {
	return Event{
		Version:    Version,
		ID:         ID(uid, deadline.UnixMilli()),
		UID:        uid,
		Segment:    segment,
		DeadlineMS: deadline.UnixMilli(),
		DetectedMS: detected.UnixMilli(),
		Source:     source,
	}
}

// ID is the id of uid's silence that ran out at deadlineMS: 32 hex digits.
func ID(uid string, deadlineMS int64) string {
	h := sha256.New()
	h.Write([]byte("stillthere/timeout/v1\x00"))
	h.Write([]byte(uid))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatInt(deadlineMS, 10)))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Deadline is the event's deadline as a time.
func (e Event) Deadline() time.Time { return time.UnixMilli(e.DeadlineMS) }

// Marshal encodes the event.
func (e Event) Marshal() ([]byte, error) { return json.Marshal(e) }

// ErrUnknownVersion means the event has a version this build cannot read.
var ErrUnknownVersion = errors.New("unknown timeout event version")

// Parse decodes and checks an event. An error wrapping ErrUnknownVersion
// means a newer producer; any other error means a malformed record.
func Parse(b []byte) (Event, error) {
	var head struct {
		Version *int `json:"v"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return Event{}, fmt.Errorf("decode timeout event: %w", err)
	}
	if head.Version == nil {
		return Event{}, errors.New("decode timeout event: no version field \"v\"")
	}
	if *head.Version != Version {
		return Event{}, fmt.Errorf("%w: %d", ErrUnknownVersion, *head.Version)
	}
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return Event{}, fmt.Errorf("decode timeout event: %w", err)
	}
	switch {
	case e.UID == "":
		return Event{}, errors.New("timeout event has no uid")
	case e.DeadlineMS <= 0:
		return Event{}, fmt.Errorf("timeout event for %q has no deadline", e.UID)
	case e.ID != ID(e.UID, e.DeadlineMS):
		return Event{}, fmt.Errorf("timeout event for %q: id %q does not match uid and deadline", e.UID, e.ID)
	}
	return e, nil
}
