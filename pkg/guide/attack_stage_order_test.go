package guide

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
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
	var mu sync.Mutex
	var order []int // stages, in the order the webhook took them
	refuse := 2     // the reminder's sends still to answer 503
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body webhook.Body
		if err := json.Unmarshal(b, &body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if body.Stage == 1 && refuse > 0 {
			refuse--
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		order = append(order, body.Stage)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(hook.Close)
	cfg := e.cfg
	cfg.Sender, cfg.WebhookURL, cfg.WebhookSecret = SenderWebhook, hook.URL, "0123456789abcdef0123456789abcdef"

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
	waitFor(t, "both stages to be taken", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	if order[0] != 1 || order[1] != 2 {
		t.Errorf("the webhook took the stages in the order %v, want the reminder before the close", order)
	}
}
