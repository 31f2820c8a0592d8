// Package guidetest receives guides in tests as a platform's webhook does
// (package webhook; "Guide webhook" in docs/protocol.md): it verifies each
// request's signature and body (stage, action and final included), shows
// the user one guide per id, and records when each guide first arrived, so
// a test can count the guides every user saw, of which stage, and how
// late they came. A test can also make it refuse the consumer, as a
// receiver whose secret was rotated first or a firewall does.
package guidetest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/webhook"
)

// Guide is one guide a user was shown.
type Guide struct {
	ID, UID, Segment, Text string
	Deadline               time.Time
	// Stage, Action, Final and Reason say which stage of the silence it
	// was: Final is its last's, and Reason why it ended there.
	Stage  int
	Action string
	Final  bool
	Reason string
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

	mu      sync.Mutex
	secrets [][]byte      // the secrets a signature may be made with
	skew    time.Duration // added to this clock when verifying
	refuse  int           // when not 0, the answer to every request
	// strict holds until the test changes the secrets or the clock: a
	// request that fails verification before is the consumer breaking
	// the contract, and fails the test.
	strict  bool
	refused int
	byID    map[string]*Guide
	byUID   map[string][]*Guide
}

// StartWebhook listens on a loopback port and stops at cleanup. A request
// that breaks the contract fails the test: answered 401 when its signature
// does not verify, 400 when its body is wrong.
func StartWebhook(t testing.TB) *Webhook {
	t.Helper()
	w := &Webhook{
		Secret: "guidetest-webhook-secret-0123456789abcdef",
		t:      t,
		strict: true,
		byID:   make(map[string]*Guide),
		byUID:  make(map[string][]*Guide),
	}
	w.secrets = [][]byte{[]byte(w.Secret)}
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
	w.mu.Lock()
	secrets, now, refuse, strict := w.secrets, at.Add(w.skew), w.refuse, w.strict
	if refuse != 0 {
		w.refused++
	}
	w.mu.Unlock()
	if refuse != 0 {
		http.Error(rw, http.StatusText(refuse), refuse)
		return
	}
	if err := webhook.Verify(r.Header.Get(webhook.HeaderSignature), body, now, secrets...); err != nil {
		if strict {
			w.t.Errorf("webhook: %v, on %s", err, body)
		}
		w.mu.Lock()
		w.refused++
		w.mu.Unlock()
		http.Error(rw, "bad signature", http.StatusUnauthorized)
		return
	}
	var g webhook.Body
	if err := json.Unmarshal(body, &g); err != nil || g.ID == "" || g.UID == "" || !stageValid(g) {
		w.t.Errorf("webhook: body %s: %v", body, err)
		http.Error(rw, "bad body", http.StatusBadRequest)
		return
	}
	if key := r.Header.Get(webhook.HeaderIdempotencyKey); key != g.ID {
		w.t.Errorf("webhook: idempotency key %q on guide %s", key, g.ID)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if seen, ok := w.byID[g.ID]; ok {
		seen.Sends++
		return // 200: shown once already
	}
	shown := &Guide{ID: g.ID, UID: g.UID, Segment: g.Segment, Text: g.Text,
		Deadline: time.UnixMilli(g.DeadlineMS), Stage: g.Stage, Action: g.Action, Final: g.Final, Reason: g.Reason, At: at, Sends: 1}
	w.byID[g.ID] = shown
	w.byUID[g.UID] = append(w.byUID[g.UID], shown)
}

// stageValid checks a body's stage as the contract has it: from 1, a
// known action, a text exactly when the action sends the user one, final
// on every close, and a reason exactly on a final stage, its action's.
func stageValid(g webhook.Body) bool {
	return g.Stage >= 1 && g.Stage <= timeoutevent.MaxStages &&
		timeoutevent.ValidAction(g.Action) &&
		(g.Text == "") == (g.Action == timeoutevent.ActionNotify) &&
		(g.Final || g.Action != timeoutevent.ActionClose) &&
		g.Final == (g.Reason != "") &&
		(g.Reason == "" || g.Reason == timeoutevent.ReasonOf(g.Action))
}

// SetSecrets replaces the secrets a signature may be made with, as a
// receiver does when the secret is rotated: SetSecrets(new) before the
// consumer has it refuses every guide, SetSecrets(new, old) accepts both.
// From then on a request that does not verify is answered 401 and counted
// by Refused, not a test failure.
func (w *Webhook) SetSecrets(secrets ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.secrets = w.secrets[:0:0]
	for _, s := range secrets {
		w.secrets = append(w.secrets, []byte(s))
	}
	w.strict = false
}

// Advance moves the receiver's clock d ahead, as if d had passed since a
// request was signed: past webhook.Tolerance it refuses a replay. Like
// SetSecrets, it makes a request that does not verify a 401, not a test
// failure.
func (w *Webhook) Advance(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.skew += d
	w.strict = false
}

// Refuse answers every request with code, before looking at it, as a
// firewall or a receiver that blocked the consumer does (403); 0 stops.
func (w *Webhook) Refuse(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refuse = code
}

// Refused is the number of requests answered with a refusal: a signature
// that did not verify, or Refuse.
func (w *Webhook) Refused() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refused
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
