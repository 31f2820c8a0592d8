package guide

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackR2ShownReminderHandedOverCostsItsClose: the fix keeps a
// reminder that an earlier attempt may have shown from being taken for
// unasked when its retry is too old, but what says so (the job's
// sendTried) lives in the member that tried. The gateway shows the
// reminder and falls over before it answers; the consumer retries it,
// refused while the gateway is down, and its partition moves to another
// member (a deploy's rolling restart, a rebalance) before the reminder
// is committed. The new owner reads the reminder again, past
// guide-max-age once the gateway is back: with no attempt of its own
// behind it, it settles it too_old, marks the silence unasked, and drops
// its close, young, as too old. The user was asked, stayed silent, and
// their chat is never closed. guide-max-age is 4s here, to fit a test.
//
// A known limit, not fixed: the new owner cannot know an earlier
// member's send may have shown the reminder; that would need the attempt
// recorded outside the process. docs/operations.md says so.
func TestAttackR2ShownReminderHandedOverCostsItsClose(t *testing.T) {
	t.Skip("known limit: whether an earlier send may have shown a reminder is known only to the member that sent it (docs/operations.md)")
	e := newEnv(t)
	cfg := e.cfg
	cfg.GuideMaxAge = 4 * time.Second
	a := e.start(cfg)
	e.waitShown(e.produce(uids("r2h-warm", 1)...))

	d := e.redisNow()
	reminder := timeoutevent.New("r2h-shown", session.DefaultSegment, d, d, timeoutevent.SourceSweep)
	e.gw.OnShown(func(id string) {
		if id != reminder.ID {
			return
		}
		e.gw.SetDown(true)
		holdsWithin(waitLong, func() bool { return e.gw.Attempts(reminder.ID) >= 2 })
	})
	e.produceEvent(reminder)
	waitFor(t, "the reminder to be shown", func() bool { return e.gw.Shown(reminder.ID) })
	waitFor(t, "the consumer to retry the reminder", func() bool { return e.gw.Attempts(reminder.ID) >= 2 })

	e.untilRedis(d.Add(2500 * time.Millisecond))
	at := e.redisNow()
	closing := reminder.AtStage(2, at, timeoutevent.ActionClose, "We closed this chat.", true)
	closing.DetectedMS = at.UnixMilli()
	e.produceEvent(closing)

	// The partition moves: the member that tried leaves, the reminder
	// uncommitted; the next owner joins once the gateway is back, the
	// reminder past guide-max-age, the close 2s younger.
	a.stop()
	e.untilRedis(d.Add(cfg.GuideMaxAge + 500*time.Millisecond))
	e.gw.OnShown(nil)
	e.gw.SetDown(false)
	b := e.start(cfg)
	e.waitCommittedToEnd(cfg.Group)

	if !e.gw.Shown(reminder.ID) {
		t.Fatal("the reminder was never shown (the premise)")
	}
	if !e.gw.Shown(closing.ID) {
		t.Errorf("the user was shown the reminder (%d pushes of it) and stayed silent, yet, its partition handed over before it was committed, "+
			"the silence's close was never sent (%d pushes of it): the next owner settled the reminder too_old with no sendTried of its own, "+
			"and dropped the close as unasked (the new owner holds the silence unasked: %v)",
			e.gw.Attempts(reminder.ID), e.gw.Attempts(closing.ID), b.c.unasked.closes(closing))
	}
}
