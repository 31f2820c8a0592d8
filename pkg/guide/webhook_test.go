package guide

import (
	"net/http"
	"slices"
	"testing"

	"github.com/sony/gobreaker/v2"

	"github.com/stillthere/stillthere/pkg/guide/guidetest"
)

// TestWebhookRefusalHoldsGuides: a webhook that refuses the consumer for a
// while, with 401 (its secret was rotated before the consumer's) or 403
// (a firewall), is the receiver failing, not a definite no: the breaker
// opens, fetching pauses, nothing is dead-lettered or committed, and once
// the receiver takes the consumer's requests again each guide is shown
// once.
func TestWebhookRefusalHoldsGuides(t *testing.T) {
	const rotated = "rotated-webhook-secret-0123456789abcdef"
	tests := []struct {
		name           string
		refuse, accept func(w *guidetest.Webhook)
	}{
		{
			name:   "401: the receiver rotated its secret first",
			refuse: func(w *guidetest.Webhook) { w.SetSecrets(rotated) },
			accept: func(w *guidetest.Webhook) { w.SetSecrets(rotated, w.Secret) },
		},
		{
			name:   "403: the receiver blocked the consumer",
			refuse: func(w *guidetest.Webhook) { w.Refuse(http.StatusForbidden) },
			accept: func(w *guidetest.Webhook) { w.Refuse(0) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			hook := guidetest.StartWebhook(t)
			cfg := e.cfg
			cfg.Sender, cfg.WebhookURL, cfg.WebhookSecret = SenderWebhook, hook.URL, hook.Secret
			rejected0 := guidesSettled(t, OutcomeRejected)
			tt.refuse(hook)
			evs := e.produce(uids("held", 8)...)
			r := e.start(cfg)

			waitFor(t, "the breaker to open and every partition to pause", func() bool {
				if n := e.deadLettered(); n != 0 {
					t.Fatalf("%d guides dead-lettered while the receiver refused the consumer", n)
				}
				return r.c.breaker.State() != gobreaker.StateClosed && slices.Equal(r.paused(), []int32{0, 1, 2, 3})
			})
			// A probe after the breaker opened is refused too.
			waitFor(t, "a refused probe", func() bool { return hook.Refused() > cfg.BreakerFailures })
			if got := e.committed(cfg.Group); len(got) != 0 {
				t.Errorf("committed %v while every guide was refused", got)
			}
			if n := e.deadLettered(); n != 0 {
				t.Errorf("%d guides dead-lettered while the receiver refused the consumer", n)
			}
			if n := hook.Count(); n != 0 {
				t.Errorf("%d guides shown while refused", n)
			}

			tt.accept(hook)
			e.waitCommittedToEnd(cfg.Group)
			for _, p := range evs {
				if g := hook.Guides(p.ev.UID); len(g) != 1 || g[0].ID != p.ev.ID {
					t.Errorf("user %s was shown %+v, want guide %s once", p.ev.UID, g, p.ev.ID)
				}
			}
			if n := e.deadLettered(); n != 0 {
				t.Errorf("%d guides dead-lettered", n)
			}
			if d := guidesSettled(t, OutcomeRejected) - rejected0; d != 0 {
				t.Errorf("%v guides settled as rejected, want 0", d)
			}
			waitFor(t, "the breaker to close and fetching to resume", func() bool {
				return r.c.breaker.State() == gobreaker.StateClosed && len(r.paused()) == 0
			})
		})
	}
}
