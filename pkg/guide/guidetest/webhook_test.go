package guidetest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/webhook"
)

// post sends body with sig as the consumer would, and returns the status.
func post(t *testing.T, w *Webhook, body []byte, sig string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	var b struct{ ID string }
	json.Unmarshal(body, &b)
	req.Header.Set(webhook.HeaderIdempotencyKey, b.ID)
	req.Header.Set(webhook.HeaderSignature, sig)
	resp, err := w.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

var body = []byte(`{"id":"g1","uid":"alice","segment":"default","text":"Still there?","deadline_ms":1795255600123,"stage":1,"action":"remind","final":false}`)

// TestReplayIsRefused: a signed request sent again within the tolerance
// shows nothing new (one guide per id); replayed later, it is refused.
func TestReplayIsRefused(t *testing.T) {
	w := StartWebhook(t)
	sig := webhook.Sign(body, time.Now(), []byte(w.Secret))
	for range 2 {
		if code := post(t, w, body, sig); code != http.StatusOK {
			t.Fatalf("signed request: %d, want 200", code)
		}
	}
	w.Advance(webhook.Tolerance + time.Minute)
	if code := post(t, w, body, sig); code != http.StatusUnauthorized {
		t.Fatalf("request replayed after the tolerance: %d, want 401", code)
	}
	if g := w.Guides("alice"); len(g) != 1 || g[0].Sends != 2 {
		t.Errorf("alice was shown %+v; want one guide from two sends, the replay refused", g)
	}
	if n := w.Refused(); n != 1 {
		t.Errorf("refused %d requests, want 1", n)
	}
	// Signed now, on the moved clock, it is a new send of the same id.
	if code := post(t, w, body, webhook.Sign(body, time.Now().Add(webhook.Tolerance+time.Minute), []byte(w.Secret))); code != http.StatusOK {
		t.Errorf("fresh request: %d, want 200", code)
	}
}

// TestRotation: a receiver that takes a new secret before the consumer
// refuses its guides with 401; accepting both settles them.
func TestRotation(t *testing.T) {
	w := StartWebhook(t)
	old := w.Secret
	const rotated = "rotated-webhook-secret-0123456789abcdef"
	w.SetSecrets(rotated)
	if code := post(t, w, body, webhook.Sign(body, time.Now(), []byte(old))); code != http.StatusUnauthorized {
		t.Fatalf("old secret after the rotation: %d, want 401", code)
	}
	w.SetSecrets(rotated, old)
	for _, k := range []string{old, rotated} {
		if code := post(t, w, body, webhook.Sign(body, time.Now(), []byte(k))); code != http.StatusOK {
			t.Errorf("while both are accepted: %d, want 200", code)
		}
	}
	if w.Count() != 1 || w.Refused() != 1 {
		t.Errorf("shown %d, refused %d; want 1 and 1", w.Count(), w.Refused())
	}
	w.Refuse(http.StatusForbidden)
	if code := post(t, w, body, webhook.Sign(body, time.Now(), []byte(old))); code != http.StatusForbidden {
		t.Errorf("while refusing: %d, want 403", code)
	}
}

// TestStagesRecorded: each stage of a silence is its own guide, recorded
// with its stage, action and final.
func TestStagesRecorded(t *testing.T) {
	w := StartWebhook(t)
	closing := []byte(`{"id":"g2","uid":"alice","segment":"default","text":"We closed this chat.","deadline_ms":1795255600123,"stage":2,"action":"close","final":true,"reason":"ended"}`)
	for _, b := range [][]byte{body, closing} {
		if code := post(t, w, b, webhook.Sign(b, time.Now(), []byte(w.Secret))); code != http.StatusOK {
			t.Fatalf("signed request: %d, want 200", code)
		}
	}
	g := w.Guides("alice")
	if len(g) != 2 {
		t.Fatalf("alice was shown %+v, want two stages", g)
	}
	if g[0].Stage != 1 || g[0].Action != "remind" || g[0].Final {
		t.Errorf("first guide %+v, want stage 1, remind, not final", g[0])
	}
	if g[1].Stage != 2 || g[1].Action != "close" || !g[1].Final || g[1].Reason != "ended" || g[1].Text != "We closed this chat." {
		t.Errorf("second guide %+v, want stage 2, close, final, reason ended", g[1])
	}
	// A close without its reason, or a final reminder without one, breaks
	// the contract: the consumer sends the last stage's reason.
	for _, b := range [][]byte{
		[]byte(`{"id":"g3","uid":"bob","text":"Closed.","deadline_ms":1795255600123,"stage":2,"action":"close","final":true}`),
		[]byte(`{"id":"g4","uid":"bob","text":"Still there?","deadline_ms":1795255600123,"stage":1,"action":"remind","final":true}`),
		[]byte(`{"id":"g5","uid":"bob","text":"Away","deadline_ms":1795255600123,"stage":1,"action":"notify","final":true,"reason":"notify"}`),
	} {
		if stageValid(decodeBody(t, b)) {
			t.Errorf("%s: valid, want refused", b)
		}
	}
	if !stageValid(decodeBody(t, []byte(`{"id":"g6","uid":"bob","text":"","deadline_ms":1795255600123,"stage":1,"action":"notify","final":true,"reason":"notify"}`))) {
		t.Error("a final notify without text refused")
	}
}

func decodeBody(t *testing.T, b []byte) webhook.Body {
	t.Helper()
	var g webhook.Body
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}
