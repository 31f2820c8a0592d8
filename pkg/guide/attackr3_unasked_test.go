package guide

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackR3ShownFirstReminderLaterTooOldDropsClose: a policy of two
// reminders and a close. The silence's first reminder is young and shown
// to the user: they were asked. Its second reminder reaches the consumer
// past guide-max-age (the consumer fell behind between the stages):
// settled too_old, and the fix marks the silence unasked, as if no
// reminder of it had gone out. The close, young, is then dropped as the
// close of a silence whose user was never asked. The user was asked (the
// first reminder), stayed silent, and their chat is never closed: the
// close stage is lost, though it would not have been their first word
// from us. guide-max-age is 4s here, to fit a test.
func TestAttackR3ShownFirstReminderLaterTooOldDropsClose(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.GuideMaxAge = 4 * time.Second
	r := e.start(cfg)
	e.waitShown(e.produce(uids("r3-warm", 1)...))
	tooOld0 := guidesSettled(t, OutcomeTooOld)

	// Stage 1, a reminder of a silence that ran out now: shown.
	d := e.redisNow()
	first := timeoutevent.New("r3-first-shown", session.DefaultSegment, d, d, timeoutevent.SourceSweep)
	first.DetectedMS = d.UnixMilli()
	e.produceEvent(first)
	waitFor(t, "the first reminder to be shown", func() bool { return e.gw.Shown(first.ID) })

	// Stage 2, a second reminder due half a second later, read by the
	// consumer past guide-max-age.
	at2 := d.Add(500 * time.Millisecond)
	second := first.AtStage(2, at2, timeoutevent.ActionRemind, "Still there?", false)
	second.DetectedMS = at2.UnixMilli()
	e.untilRedis(at2.Add(cfg.GuideMaxAge + 500*time.Millisecond))
	e.produceEvent(second)
	waitFor(t, "the second reminder to be settled too_old", func() bool { return guidesSettled(t, OutcomeTooOld) > tooOld0 })

	// The close, due now: young.
	at3 := e.redisNow()
	closing := first.AtStage(3, at3, timeoutevent.ActionClose, "We closed this chat.", true)
	closing.DetectedMS = at3.UnixMilli()
	e.produceEvent(closing)
	e.waitCommittedToEnd(cfg.Group)

	if !e.gw.Shown(first.ID) || e.gw.Shown(second.ID) {
		t.Fatalf("premise: first reminder shown %v (want true), second shown %v (want false)", e.gw.Shown(first.ID), e.gw.Shown(second.ID))
	}
	if !e.gw.Shown(closing.ID) {
		t.Errorf("the user was shown the silence's first reminder and stayed silent; its second reminder was too old, and its close, "+
			"young (read %v after due), was never sent (%d pushes of it): the second reminder's too_old marked the silence unasked "+
			"though the first had asked (silence held unasked: %v)",
			e.redisNow().Sub(at3).Round(time.Millisecond), e.gw.Attempts(closing.ID), r.c.unasked.closes(closing))
	}
}
