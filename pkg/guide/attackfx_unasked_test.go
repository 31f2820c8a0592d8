package guide

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackFXShownReminderCostsItsClose: the fix that drops a close
// whose reminder was settled too_old takes too_old to mean "the user was
// never asked". But the consumer decides too_old from the record's age
// before it knows whether an earlier attempt of the same reminder got
// through. Here the gateway shows the reminder to the user, and its
// answer never reaches the consumer (the gateway falls over right after
// showing it: the send times out and the retries are refused while it is
// down). The gateway is back once the reminder is past guide-max-age:
// the consumer settles the retried reminder too_old without sending it
// (a send would have been answered "duplicate"), remembers the silence as
// unasked, and drops its close as too old although the close is young.
// The user was asked, stayed silent, and the chat is never closed: the
// close stage is lost (nothing lost; docs/protocol.md, "Stages": only a
// close whose reminder was dropped as too old is not sent). guide-max-age
// is 4s here, to fit a test.
func TestAttackFXShownReminderCostsItsClose(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.GuideMaxAge = 4 * time.Second
	e.start(cfg)
	// The consumer has joined its group and reads: a first user's guide
	// is shown (else the reminder could age past guide-max-age before
	// the group is formed).
	e.waitShown(e.produce(uids("fx-warm", 1)...))

	d := e.redisNow()
	reminder := timeoutevent.New("fx-shown", session.DefaultSegment, d, d, timeoutevent.SourceSweep)
	// The gateway shows the reminder, then goes down before it answers:
	// the answer is held until the consumer has given up on it and tried
	// again (refused: down).
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

	// The close, due 2.5s after the reminder went out, as the listener
	// produces it.
	e.untilRedis(d.Add(2500 * time.Millisecond))
	at := e.redisNow()
	closing := reminder.AtStage(2, at, timeoutevent.ActionClose, "We closed this chat.", true)
	closing.DetectedMS = at.UnixMilli()
	e.produceEvent(closing)

	// The gateway is back once the reminder is past guide-max-age; the
	// close is 2s younger than that.
	e.untilRedis(d.Add(cfg.GuideMaxAge + 500*time.Millisecond))
	closeAge := e.redisNow().Sub(at)
	e.gw.OnShown(nil)
	e.gw.SetDown(false)
	e.waitCommittedToEnd(cfg.Group)

	if !e.gw.Shown(reminder.ID) {
		t.Fatal("the reminder was never shown (the premise)")
	}
	if !e.gw.Shown(closing.ID) {
		t.Errorf("the user was shown the reminder (%d pushes of it) and stayed silent, yet the silence's close, with %v of guide-max-age left, "+
			"was never sent (%d pushes of it): the reminder's retry was settled too_old, and its close dropped as if the user had never been asked",
			e.gw.Attempts(reminder.ID), cfg.GuideMaxAge-closeAge, e.gw.Attempts(closing.ID))
	}
}
