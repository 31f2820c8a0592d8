package guide

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackR2LaterShownReminderKeepsEarlierUnasked: a policy of two
// reminders and a close. The silence's first reminder reaches the
// consumer past guide-max-age (the consumer was behind): settled too_old,
// the silence is remembered as unasked. Its second reminder is young: the
// gateway shows it to the user and falls over before it answers (the
// send times out, the retries are refused while it is down). The gateway
// is back once that reminder is past guide-max-age: its retry is settled
// too_old, and, an earlier attempt having reached the gateway, the fix
// does not take it for unasked. But neither does it take it for asked:
// the mark the first reminder left stands, with the same deadline, and
// the close, young, is dropped as the close of a silence whose user was
// never asked. The user was asked (the second reminder), stayed silent,
// and their chat is never closed: the close stage is lost.
// guide-max-age is 4s here, to fit a test.
func TestAttackR2LaterShownReminderKeepsEarlierUnasked(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.GuideMaxAge = 4 * time.Second
	r := e.start(cfg)
	e.waitShown(e.produce(uids("r2-warm", 1)...))
	tooOld0 := guidesSettled(t, OutcomeTooOld)

	// Stage 1, a reminder of a silence that ran out 10s ago: too old on
	// arrival.
	d := e.redisNow().Add(-10 * time.Second)
	first := timeoutevent.New("r2-two-reminders", session.DefaultSegment, d, d, timeoutevent.SourceSweep)
	first.DetectedMS = d.UnixMilli()
	e.produceEvent(first)
	waitFor(t, "the first reminder to be settled too_old", func() bool { return guidesSettled(t, OutcomeTooOld) > tooOld0 })

	// Stage 2, a second reminder of the same silence, due now.
	at2 := e.redisNow()
	second := first.AtStage(2, at2, timeoutevent.ActionRemind, "Still there?", false)
	second.DetectedMS = at2.UnixMilli()
	e.gw.OnShown(func(id string) {
		if id != second.ID {
			return
		}
		e.gw.SetDown(true)
		holdsWithin(waitLong, func() bool { return e.gw.Attempts(second.ID) >= 2 })
	})
	e.produceEvent(second)
	waitFor(t, "the second reminder to be shown", func() bool { return e.gw.Shown(second.ID) })
	waitFor(t, "the consumer to retry the second reminder", func() bool { return e.gw.Attempts(second.ID) >= 2 })

	// The close, due 2.5s after the second reminder went out.
	e.untilRedis(at2.Add(2500 * time.Millisecond))
	at3 := e.redisNow()
	closing := first.AtStage(3, at3, timeoutevent.ActionClose, "We closed this chat.", true)
	closing.DetectedMS = at3.UnixMilli()
	e.produceEvent(closing)

	// The gateway is back once the second reminder is past guide-max-age.
	e.untilRedis(at2.Add(cfg.GuideMaxAge + 500*time.Millisecond))
	closeAge := e.redisNow().Sub(at3)
	e.gw.OnShown(nil)
	e.gw.SetDown(false)
	e.waitCommittedToEnd(cfg.Group)

	if e.gw.Shown(first.ID) || !e.gw.Shown(second.ID) {
		t.Fatalf("premise: first reminder shown %v (want false), second shown %v (want true)", e.gw.Shown(first.ID), e.gw.Shown(second.ID))
	}
	if !e.gw.Shown(closing.ID) {
		t.Errorf("the user was shown the silence's second reminder (%d pushes of it) and stayed silent, yet its close, with %v of guide-max-age left, "+
			"was never sent (%d pushes of it): the first reminder's too_old mark still stood, the shown second reminder's too_old retry never cleared it (silence held unasked: %v)",
			e.gw.Attempts(second.ID), cfg.GuideMaxAge-closeAge, e.gw.Attempts(closing.ID), r.c.unasked.closes(closing))
	}
}
