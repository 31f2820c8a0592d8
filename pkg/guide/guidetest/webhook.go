// Package guidetest receives guides in tests as a platform's webhook does
// (see "Guide webhook" in docs/protocol.md): it checks each request's
// signature, shows the user one guide per id, and records when each guide
// first arrived, so a test can count the guides every user saw and how
// late they came.
package guidetest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// Request headers of the webhook contract.
const (
	headerIdempotencyKey = "Idempotency-Key"
	headerSignature      = "X-Stillthere-Signature"
)

// Guide is one guide a user was shown.
type Guide struct {
	ID, UID, Segment, Text string
	Deadline               time.Time
	// At is when its first send arrived; Sends counts them all, repeats
	// included.
	At    time.Time
	Sends int
}

// Webhook is a running receiver. Its methods may be called from any
// goroutine.
type Webhook struct {
	// URL is where the consumer posts guides, and Secret the key it signs
	// them with.
	URL    string
	Secret string

	srv *httptest.Server
	t   testing.TB

	mu    sync.Mutex
	byID  map[string]*Guide
	byUID map[string][]*Guide
}

// StartWebhook listens on a loopback port and stops at cleanup. A request
// that breaks the contract fails the test and is answered 400.
func StartWebhook(t testing.TB) *Webhook {
	t.Helper()
	w := &Webhook{
		Secret: "guidetest-webhook-secret-0123456789abcdef",
		t:      t,
		byID:   make(map[string]*Guide),
		byUID:  make(map[string][]*Guide),
	}
	w.srv = httptest.NewServer(http.HandlerFunc(w.serve))
	w.URL = w.srv.URL + "/guides"
	t.Cleanup(w.srv.Close)
	return w
}

func (w *Webhook) serve(rw http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	m := hmac.New(sha256.New, []byte(w.Secret))
	m.Write(body)
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	if !hmac.Equal([]byte(r.Header.Get(headerSignature)), []byte(want)) {
		w.t.Errorf("webhook: bad signature on %s", body)
		http.Error(rw, "bad signature", http.StatusBadRequest)
		return
	}
	var g struct {
		ID         string `json:"id"`
		UID        string `json:"uid"`
		Segment    string `json:"segment"`
		Text       string `json:"text"`
		DeadlineMS int64  `json:"deadline_ms"`
	}
	if err := json.Unmarshal(body, &g); err != nil || g.ID == "" || g.UID == "" {
		w.t.Errorf("webhook: body %s: %v", body, err)
		http.Error(rw, "bad body", http.StatusBadRequest)
		return
	}
	if key := r.Header.Get(headerIdempotencyKey); key != g.ID {
		w.t.Errorf("webhook: idempotency key %q on guide %s", key, g.ID)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if seen, ok := w.byID[g.ID]; ok {
		seen.Sends++
		return // 200: shown once already
	}
	shown := &Guide{ID: g.ID, UID: g.UID, Segment: g.Segment, Text: g.Text,
		Deadline: time.UnixMilli(g.DeadlineMS), At: at, Sends: 1}
	w.byID[g.ID] = shown
	w.byUID[g.UID] = append(w.byUID[g.UID], shown)
}

// Guides returns the guides uid was shown, in order of arrival.
func (w *Webhook) Guides(uid string) []Guide {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Guide, 0, len(w.byUID[uid]))
	for _, g := range w.byUID[uid] {
		out = append(out, *g)
	}
	return out
}

// Users returns every uid shown a guide, sorted.
func (w *Webhook) Users() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.byUID))
	for uid := range w.byUID {
		out = append(out, uid)
	}
	slices.Sort(out)
	return out
}

// Count is the number of guides shown, one per id.
func (w *Webhook) Count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.byID)
}
