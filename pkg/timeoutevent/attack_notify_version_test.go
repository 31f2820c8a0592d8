package timeoutevent

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

// TestAttackNotifyEventClaimsAVersionOldBuildsRefuse breaks the rollback
// rule of the event's version (package doc: "versioned by its v field";
// the listener's spool replay, expiry/replay.go: an event "spooled by a
// newer build before a rollback" is recognised by ErrUnknownVersion and
// produced as it is, "consumers that cannot read it dead-letter it,
// where it is kept"). A notify stage's event is written as v 1, the
// version builds before notify stages read, and those builds refuse
// action "notify" as a malformed event, not an unknown version (their
// Parse: `action "notify", want "remind" or "close"`, checked against
// the previous build's package). So a listener rolled back while its
// spool holds a notify stage takes the other branch of its replay: "drop
// unreadable spooled event" (counted as a corrupt disk). The notify is
// lost, and the stage after it, which waits in the index for that
// replay to make it due (session.AfterReplay), never falls due: the
// user's close is lost with it. The actions of v 1 as those builds read
// them are remind and close; an event with another must not claim v 1.
func TestAttackNotifyEventClaimsAVersionOldBuildsRefuse(t *testing.T) {
	d := time.UnixMilli(1795255600123)
	ev := New("gone", "default", d, d, SourceSweep).AtStage(2, d.Add(2*time.Minute), ActionNotify, "", false) // a close follows
	b, err := ev.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		V      int    `json:"v"`
		Action string `json:"action"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		t.Fatal(err)
	}
	v1Actions := []string{ActionRemind, ActionClose} // as builds before notify stages accept them
	if head.V == 1 && !slices.Contains(v1Actions, head.Action) {
		t.Errorf("a %s stage's event claims v %d, whose readers before notify stages refuse it as malformed, not as a newer version: %s",
			head.Action, head.V, b)
	}
}
