package guide

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/stillthere/stillthere/pkg/guide/guidetest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// notifySilence is a silence of uid whose stage 1 reminds at the
// deadline, due now, and whose stage 2, its last, notifies a second
// later.
func (e *testEnv) notifySilence(uid string) (remind, notify timeoutevent.Event) {
	e.t.Helper()
	now, err := e.rdb.Time(context.Background()).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.seq++
	d := now.Truncate(time.Millisecond).Add(-2*time.Second + time.Duration(e.seq)*time.Millisecond)
	e.mu.Unlock()
	remind = timeoutevent.New(uid, session.DefaultSegment, d, d, timeoutevent.SourceSweep)
	notify = remind.AtStage(2, d.Add(time.Second), timeoutevent.ActionNotify, "", true)
	return remind, notify
}

// TestNotifyStage: a notify stage sends the user nothing: the gateway
// gets stage 1's reminder and nothing of stage 2, and the platform's
// notify webhook shows stage 2 once, signed, with action notify, final
// and reason notify, though its record was produced twice: both sends
// carry its id as their idempotency key. Each send is in the user's
// timeline as sent to the platform.
func TestNotifyStage(t *testing.T) {
	e := newEnv(t)
	hook := guidetest.StartWebhook(t)
	cfg := e.cfg
	cfg.NotifyURL, cfg.NotifySecret = hook.URL, hook.Secret
	remind, notify := e.notifySilence("away")
	e.produceEvent(remind)
	e.produceEvent(notify)
	e.produceEvent(notify) // a listener's retry: the same id
	e.start(cfg)
	e.waitCommittedToEnd(cfg.Group)

	if !e.gw.Shown(remind.ID) || e.gw.ShownTo("away") != 1 || e.gw.Attempts(notify.ID) != 0 {
		t.Errorf("the gateway: reminder shown %v, %d guides to the user, %d pushes of the notify stage; want the reminder only",
			e.gw.Shown(remind.ID), e.gw.ShownTo("away"), e.gw.Attempts(notify.ID))
	}
	got := hook.Guides("away")
	if len(got) != 1 {
		t.Fatalf("notify webhook got %+v, want stage 2 once", got)
	}
	if g := got[0]; g.ID != notify.ID || g.Action != timeoutevent.ActionNotify || g.Stage != 2 || !g.Final || g.Reason != timeoutevent.ReasonNotify || g.Text != "" || g.Sends != 2 {
		t.Errorf("notify webhook got %+v, want stage 2's notify, final, reason notify, no text", g)
	}
	if n := e.deadLettered(); n != 0 {
		t.Errorf("%d records dead-lettered", n)
	}
	es := e.waitTimeline("away", 3)
	for _, en := range es[1:] {
		if en.Kind != timeline.KindSent || en.Rule != RuleNotify || en.Code != http.StatusOK || en.Event != notify.ID {
			t.Errorf("timeline %+v, want the notify sent to the platform with its status", en)
		}
	}
}

// TestNotifyCancelledByActivity: a user who renewed after the deadline is
// back: their notify stage is stale, and the platform hears nothing.
func TestNotifyCancelledByActivity(t *testing.T) {
	e := newEnv(t)
	hook := guidetest.StartWebhook(t)
	cfg := e.cfg
	cfg.NotifyURL, cfg.NotifySecret = hook.URL, hook.Secret
	_, notify := e.notifySilence("back")
	if _, err := e.store.Renew(context.Background(), "back", session.DefaultSegment, time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	stale0 := guidesSettled(t, OutcomeStale)
	e.produceEvent(notify)
	e.start(cfg)
	e.waitCommittedToEnd(cfg.Group)
	if n := hook.Count(); n != 0 {
		t.Errorf("the platform was notified %d times of a user who came back", n)
	}
	if d := guidesSettled(t, OutcomeStale) - stale0; d != 1 {
		t.Errorf("stale outcomes: %v, want 1", d)
	}
}

// TestNotifyWithoutWebhook: with guides through the gateway and no
// notify webhook set, a notify stage cannot go anywhere: it is
// dead-lettered, the reason naming the setting, and the rest flow on.
func TestNotifyWithoutWebhook(t *testing.T) {
	e := newEnv(t)
	remind, notify := e.notifySilence("nowhere")
	e.produceEvent(remind)
	e.produceEvent(notify)
	e.start(e.cfg)
	e.waitCommittedToEnd(e.cfg.Group)
	d := e.deadLetters(1)
	if len(d) != 1 || d[0].key != "nowhere" || !strings.Contains(d[0].headers[HeaderDLQReason], "notify-url") {
		t.Fatalf("dead letters %+v, want the notify stage with a reason naming notify-url", d)
	}
	if !e.gw.Shown(remind.ID) || e.gw.Attempts(notify.ID) != 0 {
		t.Errorf("reminder shown %v, notify pushed %d times; want the reminder only", e.gw.Shown(remind.ID), e.gw.Attempts(notify.ID))
	}
}

// TestNotifyThroughGuideWebhook: with guides through the platform's
// webhook and no notify webhook of its own, notify stages go to the
// guide webhook, told apart by their action.
func TestNotifyThroughGuideWebhook(t *testing.T) {
	e := newEnv(t)
	hook := guidetest.StartWebhook(t)
	cfg := e.cfg
	cfg.Sender, cfg.WebhookURL, cfg.WebhookSecret = SenderWebhook, hook.URL, hook.Secret
	remind, notify := e.notifySilence("hooked")
	e.produceEvent(remind)
	e.produceEvent(notify)
	e.start(cfg)
	e.waitCommittedToEnd(cfg.Group)
	got := hook.Guides("hooked")
	if len(got) != 2 || got[0].ID != remind.ID || got[0].Final || got[0].Reason != "" ||
		got[1].ID != notify.ID || got[1].Action != timeoutevent.ActionNotify || !got[1].Final {
		t.Fatalf("webhook got %+v, want the reminder (not final), then the notify (final)", got)
	}
}

// TestNotifyWebhookDown: a notify webhook that fails opens its own
// breaker, which holds notify stages and not the guides: other users'
// guides are delivered meanwhile and fetching goes on, while each notify
// user's close stage waits behind their notify. Nothing is dead-lettered;
// once the webhook answers again, the platform hears each notify once,
// and only then is the close pushed.
func TestNotifyWebhookDown(t *testing.T) {
	e := newEnv(t)
	hook := guidetest.StartWebhook(t)
	cfg := e.cfg
	cfg.NotifyURL, cfg.NotifySecret = hook.URL, hook.Secret
	hook.Refuse(http.StatusServiceUnavailable)
	type silence struct{ notify, close timeoutevent.Event }
	var notified []silence
	for _, uid := range uids("down", 4) {
		_, n := e.notifySilence(uid)
		n = n.AtStage(2, time.UnixMilli(n.DueMS), timeoutevent.ActionNotify, "", false)
		c := n.AtStage(3, time.UnixMilli(n.DueMS+1), timeoutevent.ActionClose, "Closed.", true)
		e.produceEvent(n)
		e.produceEvent(c)
		notified = append(notified, silence{n, c})
	}
	r := e.start(cfg)
	waitFor(t, "the notify breaker to open", func() bool { return r.c.notifyBreaker.State() != gobreaker.StateClosed })
	// Guides of users without a notify go out meanwhile, fetched after
	// the breaker opened.
	others := e.produce(uids("other", 6)...)
	e.waitShown(others)
	if p := r.paused(); len(p) != 0 {
		t.Errorf("partitions %v paused while only the notify webhook failed", p)
	}
	for _, s := range notified {
		if n := e.gw.Attempts(s.close.ID); n != 0 {
			t.Errorf("%s: close stage pushed %d times before its notify went out", s.close.UID, n)
		}
	}
	if n := e.deadLettered(); n != 0 {
		t.Errorf("%d dead-lettered while the notify webhook was down", n)
	}
	if c := breakerChanges(t, downstreamNotify, "open"); c < 1 {
		t.Errorf("notify breaker opens: %v, want its own label", c)
	}
	hook.Refuse(0)
	e.waitCommittedToEnd(cfg.Group)
	for _, s := range notified {
		g := hook.Guides(s.notify.UID)
		if len(g) != 1 || g[0].ID != s.notify.ID {
			t.Errorf("%s: notified %+v, want once", s.notify.UID, g)
			continue
		}
		if p, ok := e.gw.Get(s.close.ID); !ok || p.At.Before(g[0].At) {
			t.Errorf("%s: close stage pushed %v at %v, want after its notify at %v", s.close.UID, ok, p.At, g[0].At)
		}
	}
	if n := e.deadLettered(); n != 0 {
		t.Errorf("%d dead-lettered", n)
	}
}

func breakerChanges(t *testing.T, downstream, to string) float64 {
	return metricValue(t, "stillthere_consumer_breaker_changes_total", "downstream", downstream, "to", to)
}
