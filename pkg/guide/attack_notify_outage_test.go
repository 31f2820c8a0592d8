package guide

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/stillthere/stillthere/pkg/guide/guidetest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// redisNow is Redis's clock, which dates events and judges their age.
func (e *testEnv) redisNow() time.Time {
	e.t.Helper()
	now, err := e.rdb.Time(context.Background()).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return now.Truncate(time.Millisecond)
}

// untilRedis waits until Redis's clock has passed at.
func (e *testEnv) untilRedis(at time.Time) {
	e.t.Helper()
	waitFor(e.t, "Redis's clock to pass "+at.Format(time.RFC3339Nano), func() bool { return e.redisNow().After(at) })
}

// TestAttackNotifyOutageHoldsOthersGuides breaks "on time" for guides
// that have nothing to do with notify stages. The notify webhook is the
// platform's endpoint, not ours; while it fails, its breaker pauses
// fetching for every user (docs/protocol.md, "Notify webhook": "guides
// wait with it"). other, a user on another partition whose reminder falls
// due during the outage, waits unfetched behind a stranger's notify
// although the gateway that would show it is up and nothing of ours is
// down: a silence we caused is not a silence, but here nobody's silence
// is the cause, and the guide still goes out late, by up to
// guide-max-age (5 minutes by default: the held notify is then dropped
// as too old, which alone lets fetching resume). The test gives the
// reminder 5 seconds, fifty times what the gateway takes.
func TestAttackNotifyOutageHoldsOthersGuides(t *testing.T) {
	e := newEnv(t)
	hook := guidetest.StartWebhook(t)
	cfg := e.cfg
	cfg.NotifyURL, cfg.NotifySecret = hook.URL, hook.Secret
	if partitionOf("gone") == partitionOf("other") {
		t.Fatal("gone and other share a partition: the test needs them apart")
	}
	hook.Refuse(http.StatusServiceUnavailable)

	// gone: stage 2 of a silence notifies the platform, due now.
	now := e.redisNow()
	d := now.Add(-time.Second)
	notify := timeoutevent.New("gone", session.DefaultSegment, d, d, timeoutevent.SourceSweep).
		AtStage(2, now, timeoutevent.ActionNotify, "", true)
	e.produceEvent(notify)
	r := e.start(cfg)
	waitFor(t, "the notify breaker to open", func() bool { return r.c.notifyBreaker.State() != gobreaker.StateClosed })

	// other: a reminder at its deadline, now, for the gateway, which is up.
	at := e.redisNow()
	other := timeoutevent.New("other", session.DefaultSegment, at, at, timeoutevent.SourceSweep)
	e.produceEvent(other)
	produced := time.Now()
	const onTime = 5 * time.Second
	shown := holdsWithin(onTime, func() bool { return e.gw.Shown(other.ID) })
	back := time.Now()
	hook.Refuse(0)
	if !shown {
		waitFor(t, "other's reminder once the notify webhook is back", func() bool { return e.gw.Shown(other.ID) })
		p, _ := e.gw.Get(other.ID)
		t.Errorf("other's reminder, due during another user's notify-webhook outage, was not shown within %v though the gateway was up; "+
			"it went out %v after it was produced, %v after the notify webhook answered again",
			onTime, p.At.Sub(produced).Round(10*time.Millisecond), p.At.Sub(back).Round(10*time.Millisecond))
	}
	e.waitCommittedToEnd(cfg.Group)
}

// TestAttackNotifyOutageDropsNotify breaks docs/protocol.md, "Notify
// webhook": "While the notify webhook fails ... nothing is lost or
// reordered", and "It has every guarantee of a guide: it is held through
// an outage". A notify webhook that fails for longer than guide-max-age
// (5 minutes by default; 3s here, to fit a test) loses every notify held
// through it: the probe that finds the notify older than guide-max-age
// settles it as too_old, and the platform is never told the user went
// away. Nothing of the user's changed: they are as silent as when the
// notify fell due; only the platform's endpoint was down.
func TestAttackNotifyOutageDropsNotify(t *testing.T) {
	e := newEnv(t)
	hook := guidetest.StartWebhook(t)
	cfg := e.cfg
	cfg.NotifyURL, cfg.NotifySecret = hook.URL, hook.Secret
	cfg.GuideMaxAge = 3 * time.Second
	hook.Refuse(http.StatusServiceUnavailable)
	tooOld0 := guidesSettled(t, OutcomeTooOld)

	now := e.redisNow()
	d := now.Add(-time.Second)
	notify := timeoutevent.New("gone", session.DefaultSegment, d, d, timeoutevent.SourceSweep).
		AtStage(2, now, timeoutevent.ActionNotify, "", true)
	e.produceEvent(notify)
	r := e.start(cfg)
	waitFor(t, "the notify breaker to open", func() bool { return r.c.notifyBreaker.State() != gobreaker.StateClosed })

	// The notify webhook stays down a little past guide-max-age.
	e.untilRedis(now.Add(cfg.GuideMaxAge + 500*time.Millisecond))
	hook.Refuse(0)
	e.waitCommittedToEnd(cfg.Group)
	if g := hook.Guides("gone"); len(g) != 1 || g[0].ID != notify.ID {
		t.Errorf("the platform heard %+v of gone's notify stage, held through its webhook's outage; want it once (%v events settled too_old)",
			g, guidesSettled(t, OutcomeTooOld)-tooOld0)
	}
}

// TestAttackNotifyOutageCloseOvertakes breaks "ordered with the user's
// other stages" (the issue; docs/protocol.md, "Notify webhook": "in order
// with the user's other stages ... nothing is lost or reordered"). A
// policy of [remind, notify, close]: the notify tells the platform the
// user went away (free the agent, send a mobile push), the close then
// ends the chat. The notify webhook is down, the gateway up. The consumer
// holds the close behind the notify (per key), but only until the notify
// has aged past guide-max-age: the probe then settles it too_old, fetching
// resumes, and the close, younger, goes to the user. The user's chat is
// closed while the platform was never told they went away, and the
// notify webhook still has not answered once. guide-max-age is 4s here,
// to fit a test.
func TestAttackNotifyOutageCloseOvertakes(t *testing.T) {
	e := newEnv(t)
	hook := guidetest.StartWebhook(t)
	cfg := e.cfg
	cfg.NotifyURL, cfg.NotifySecret = hook.URL, hook.Secret
	cfg.GuideMaxAge = 4 * time.Second
	hook.Refuse(http.StatusServiceUnavailable)

	now := e.redisNow()
	d := now.Add(-time.Second)
	first := timeoutevent.New("gone", session.DefaultSegment, d, d, timeoutevent.SourceSweep)
	notify := first.AtStage(2, now, timeoutevent.ActionNotify, "", false)
	var overtaken []string // what the platform had heard of gone when the close was shown
	closedAt := make(chan struct{})
	e.gw.OnShown(func(id string) {
		if id != first.ID && id != notify.ID {
			for _, g := range hook.Guides("gone") {
				overtaken = append(overtaken, g.ID)
			}
			close(closedAt)
		}
	})
	e.produceEvent(notify)
	r := e.start(cfg)
	waitFor(t, "the notify breaker to open", func() bool { return r.c.notifyBreaker.State() != gobreaker.StateClosed })

	// The close is due (and found due) 2s after the notify, as a listener
	// produces it: its delay after the notify went out, whether or not the
	// platform has heard it.
	e.untilRedis(now.Add(2 * time.Second))
	at := e.redisNow()
	closing := first.AtStage(3, at, timeoutevent.ActionClose, "We closed this chat.", true)
	closing.DetectedMS = at.UnixMilli()
	e.produceEvent(closing)

	// The notify webhook stays down a while longer than guide-max-age.
	closed := holdsWithin(2*cfg.GuideMaxAge, func() bool { return e.gw.Shown(closing.ID) })
	hook.Refuse(0)
	e.waitCommittedToEnd(cfg.Group)
	if !closed {
		return // the close waited for the notify: in order
	}
	<-closedAt
	if !slices.Contains(overtaken, notify.ID) {
		t.Errorf("gone's close was shown while the notify before it had not reached the platform (it had heard %v); "+
			"after the outage it heard %+v", overtaken, hook.Guides("gone"))
	}
}
