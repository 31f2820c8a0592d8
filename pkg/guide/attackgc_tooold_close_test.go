package guide

import (
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackGCCloseWithoutItsReminder: a policy of [remind, close after a
// delay shorter than guide-max-age]. The gateway (ours) is down from the
// silence's deadline on: the reminder waits in the consumer, held by the
// open breaker. The listener produces the close its delay after the
// reminder went out to Kafka, whether or not anyone was told. The
// gateway comes back once the reminder is past guide-max-age but the
// close is not: the consumer drops the reminder as too old and sends the
// close. The user, never asked whether they are still there, is told
// their chat was closed (and their connections closed with 4000): a
// close without its reminder, and a silence we caused (our gateway's
// outage) costing the user their chat. docs/protocol.md, "Stages": a
// close "tells them the chat is closed" after the reminders; the gateway
// itself holds that "a close never comes before its reminder".
// guide-max-age is 4s here, to fit a test.
func TestAttackGCCloseWithoutItsReminder(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.GuideMaxAge = 4 * time.Second
	tooOld0 := guidesSettled(t, OutcomeTooOld)

	// The gateway is down: a first user's guide opens the breaker.
	e.gw.SetDown(true)
	r := e.start(cfg)
	e.produce(uids("gcw-warm", 1)...)
	waitFor(t, "the gateway breaker to open", func() bool { return r.c.breaker.State() != gobreaker.StateClosed })

	// The silence: its reminder due now.
	d := e.redisNow()
	reminder := timeoutevent.New("gcw-silent", session.DefaultSegment, d, d, timeoutevent.SourceSweep)
	e.produceEvent(reminder)
	// The close, due 2.5s after the reminder went out to Kafka, as the
	// listener produces it.
	e.untilRedis(d.Add(2500 * time.Millisecond))
	at := e.redisNow()
	closing := reminder.AtStage(2, at, timeoutevent.ActionClose, "We closed this chat.", true)
	closing.DetectedMS = at.UnixMilli()
	e.produceEvent(closing)

	// The gateway stays down until the reminder is past guide-max-age;
	// the close is then 2s younger than that.
	e.untilRedis(d.Add(cfg.GuideMaxAge + 500*time.Millisecond))
	e.gw.SetDown(false)
	e.waitCommittedToEnd(cfg.Group)

	remindShown, closeShown := e.gw.Shown(reminder.ID), e.gw.Shown(closing.ID)
	if closeShown && !remindShown {
		t.Errorf("the close of a silence was shown and its reminder never was (%v events settled too_old): "+
			"the user, never asked whether they were still there, had their chat closed after our gateway's outage",
			guidesSettled(t, OutcomeTooOld)-tooOld0)
	}
}
