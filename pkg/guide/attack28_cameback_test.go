package guide

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttack28CameBackBeforeTheGuide: the listener settles a silence's
// first stage with its next one as soon as the event is produced (or
// spooled, while Kafka is out of reach), before any consumer has read it.
// A user who comes back in between ends the silence between its stages,
// so the gateway's renewal script records that the stages left are
// cancelled. Then the consumer reads the event, finds the session live
// and sends nothing (skipped: came-back). The renewal's entry must not
// say the user was guided, or came back after a guide: none went out.
func TestAttack28CameBackBeforeTheGuide(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	gw := e.store.WithHoldNotes(timeline.Settings{}.HoldNotes("gateway", "gw-1"))
	const uid = "a28-back"

	if _, err := gw.Renew(ctx, uid, session.DefaultSegment, 10*time.Millisecond, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	var due []session.Expired
	waitFor(t, "the 10ms grant to fall due", func() bool {
		var err error
		if due, _, err = e.store.Due(ctx, 10); err != nil {
			t.Fatal(err)
		}
		return len(due) == 1
	})
	// The listener: stage 1 produced, then settled with stage 2 an hour on.
	ev := timeoutevent.New(uid, session.DefaultSegment, due[0].Deadline, due[0].Due, timeoutevent.SourceSweep)
	b, err := ev.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	e.produceRaw(partitionOf(uid), uid, b)
	due[0].NextDue = due[0].Due.Add(time.Hour)
	if err := e.store.Settle(ctx, due); err != nil {
		t.Fatal(err)
	}
	// The user is back before the consumer has read the event.
	if _, err := gw.Renew(ctx, uid, session.DefaultSegment, time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}

	e.start(e.cfg)
	got := e.waitTimeline(uid, 2)
	var skipped, cameBack *timeline.Entry
	for i := range got {
		switch {
		case got[i].Kind == timeline.KindSkipped && got[i].Rule == RuleCameBack:
			skipped = &got[i]
		case got[i].Kind == timeline.KindGranted:
			cameBack = &got[i]
		}
	}
	if skipped == nil || e.gw.Shown(ev.ID) {
		t.Fatalf("timeline %v, shown %v: want the consumer's skipped:came-back and no guide (the premise)", timeline.Kinds(got), e.gw.Shown(ev.ID))
	}
	if cameBack == nil {
		t.Fatalf("timeline %v: want the renewal's granted entry, the stages left cancelled", timeline.Kinds(got))
	}
	for _, claim := range []string{"guide", "came back", "asked"} {
		if strings.Contains(cameBack.Detail, claim) || strings.Contains(cameBack.Rule, "came-back") {
			t.Errorf("the gateway recorded granted:%s (stage %d, %q) though no guide was sent: the consumer then skipped the event (%q). "+
				"A reader is told the user came back after being asked", cameBack.Rule, cameBack.Stage, cameBack.Detail, skipped.Detail)
			break
		}
	}
}
