package guide

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
)

// TestAttack26bDeliveredGuideRecordedAsSkipped proves that a guide the
// user was shown can have, as its only entry in the timeline, "skipped:
// duplicate". The gateway finishes a push the consumer gave up on (it
// is not cut short by the consumer hanging up, pushTimeout 10s against
// send-timeout 5s by default; a retry meanwhile hears 409, then
// duplicate). The timed-out attempt records nothing, the retry's answer
// "duplicate" is recorded as skipped, and the timeline of a user who WAS
// nudged answers "why did nobody nudge this user?" with "skipped". The
// brief's wrong-entry case: the guide's one settlement is that it was
// sent (the gateway had delivered it), not that it was skipped.
func TestAttack26bDeliveredGuideRecordedAsSkipped(t *testing.T) {
	e := newEnv(t)
	// The first push of a guide is shown, and its answer held until the
	// consumer, having given up on it (send-timeout 200ms here), pushes
	// it again: as a gateway slow to answer a push it completes.
	e.gw.OnShown(func(id string) {
		holdsWithin(waitLong, func() bool { return e.gw.Attempts(id) >= 2 })
	})
	e.start(e.cfg)
	evs := e.produce("tl-slow")
	e.waitShown(evs)
	waitFor(t, "the consumer's second push", func() bool { return e.gw.Attempts(evs[0].ev.ID) >= 2 })
	got := e.waitTimeline("tl-slow", 1)
	if !e.gw.Shown(evs[0].ev.ID) {
		t.Fatal("the guide was not shown: the test's premise failed")
	}
	if got[0].Kind != timeline.KindSent {
		t.Errorf("the user was shown guide %s, and its timeline's only entry is %s:%s (%q): a guide delivered reads as not sent",
			evs[0].ev.ID, got[0].Kind, got[0].Rule, got[0].Detail)
	}
}

// TestAttack26bPlatformEndRecordedAsCameBack proves that a silence the
// platform ended (activity "end" after the deadline: an agent closed the
// conversation) is recorded as "skipped: came-back", with the detail
// "renewed after the deadline": the session check reads the end as the
// user's last renewal, and entries() names every stale check a return.
// The user never came back; a support person asking "why was nobody
// nudged?" is told the user returned, when the platform ended the
// conversation. The brief's "skipped came-back for a user who did not
// come back".
func TestAttack26bPlatformEndRecordedAsCameBack(t *testing.T) {
	e := newEnv(t)
	const uid = "tl-agent-closed"
	evs := e.produce(uid) // deadline a second ago
	// After the deadline, the platform ends the conversation.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := e.store.ApplyActivity(ctx, "platform-test", session.SegmentRules{}, []session.Activity{{UID: uid, Kind: session.ActivityEnd}})
	if err != nil || res.Applied != 1 {
		t.Fatalf("apply the end: %+v, %v", res, err)
	}
	e.start(e.cfg)
	got := e.waitTimeline(uid, 1)
	if e.gw.Shown(evs[0].ev.ID) {
		t.Fatal("a guide went to a user whose conversation the platform ended")
	}
	if got[0].Rule == RuleCameBack {
		t.Errorf("a conversation the platform ended after the deadline is recorded %s:%s (%q): the user did not come back",
			got[0].Kind, got[0].Rule, got[0].Detail)
	}
}
