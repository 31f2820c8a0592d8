package guide

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/webhook"
)

// TestAttackStagesOfASilenceInOrder: docs/protocol.md, Webhook: "The
// stages of one silence come as separate requests, each with its own id,
// in order". Two stages of one silence wait on the topic together, as
// after a consumer was down or lagging for longer than the delay between
// them, or after a Kafka outage across both: the reminder, then the
// close. The webhook answers the reminder's first two sends with 503, a
// failure the consumer retries. The consumer sends the records of one
// partition concurrently, so the close overtakes the reminder: the
// platform closes the conversation, and is then asked to remind the user
// whether they are still there. (Through the push endpoint, a close
// overtaking its reminder closes the user's connections first, and the
// reminder is then stale: the user never sees it.)
func TestAttackStagesOfASilenceInOrder(t *testing.T) {
	e := newEnv(t)
	hook := newOrderHook(t, 2) // the reminder's first sends answered 503
	cfg := e.cfg
	cfg.Sender, cfg.WebhookURL, cfg.WebhookSecret = SenderWebhook, hook.url, "0123456789abcdef0123456789abcdef"

	now, err := e.rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	d := now.Add(-4 * time.Second).Truncate(time.Millisecond)
	reminder := timeoutevent.New("olga", session.DefaultSegment, d, d.Add(50*time.Millisecond), timeoutevent.SourceSweep)
	closing := reminder.AtStage(2, d.Add(3*time.Second), timeoutevent.ActionClose, "We closed this chat.", true)
	e.produceEvent(reminder)
	e.produceEvent(closing)
	e.start(cfg)
	waitFor(t, "both stages to be taken", func() bool { return len(hook.taken()) == 2 })
	order := hook.taken()
	if order[0] != 1 || order[1] != 2 {
		t.Errorf("the webhook took the stages in the order %v, want the reminder before the close", order)
	}
}

// orderHook is a guide webhook that records the stages it takes, in
// order, and answers the first refuse sends of stage 1 with a 503.
type orderHook struct {
	url    string
	mu     sync.Mutex
	order  []int
	refuse int
}

func newOrderHook(t *testing.T, refuse int) *orderHook {
	h := &orderHook{refuse: refuse}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body webhook.Body
		if err := json.Unmarshal(b, &body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if body.Stage == 1 && h.refuse > 0 {
			h.refuse--
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		h.order = append(h.order, body.Stage)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

// taken is the stages taken so far, in order.
func (h *orderHook) taken() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.order)
}
