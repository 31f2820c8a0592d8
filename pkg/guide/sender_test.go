package guide

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/stillthere/stillthere/pkg/webhook"
)

func TestSenderOutcomes(t *testing.T) {
	tests := []struct {
		name   string
		status int     // answer status; 0 means never answer
		body   string  // answer body
		want   Outcome // empty means an error
		perm   bool    // the error is the downstream's definite no
	}{
		{name: "delivered", status: 200, body: `{"status":"delivered"}`, want: OutcomeDelivered},
		{name: "duplicate", status: 200, body: `{"status":"duplicate"}`, want: OutcomeDuplicate},
		{name: "queued", status: 200, body: `{"status":"queued","connections":0}`, want: OutcomeQueued},
		{name: "404 is not a settled outcome", status: 404, body: `{"status":"offline"}`},
		{name: "bad request is permanent", status: 400, body: `{"error":"uid invalid"}`, perm: true},
		{name: "bad request without body is permanent", status: 400, body: ``, perm: true},
		{name: "unknown 200 status fails", status: 200, body: `{"status":"maybe"}`},
		{name: "200 not json fails", status: 200, body: `<html>ok</html>`},
		{name: "404 page fails", status: 404, body: `404 page not found`},
		{name: "unauthorized fails", status: 401, body: `{"error":"bad secret"}`},
		{name: "forbidden fails", status: 403, body: `{"error":"forbidden"}`},
		{name: "too many requests fails", status: 429, body: `{"error":"slow down"}`},
		{name: "internal error fails", status: 500, body: `{"error":"boom"}`},
		{name: "unavailable fails", status: 503, body: `{"error":"draining"}`},
		{name: "timeout fails", status: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// The server notices a client gone only once the body
				// is read.
				io.Copy(io.Discard, r.Body)
				if tt.status == 0 {
					<-r.Context().Done()
					return
				}
				w.WriteHeader(tt.status)
				w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			s := &gatewaySender{url: srv.URL, secret: testSecret, client: &http.Client{Timeout: 100 * time.Millisecond}}

			got, err := s.Send(context.Background(), Guide{ID: "g1", UID: "u1", Text: testText})
			if tt.want != "" {
				if err != nil || got.Outcome != tt.want {
					t.Fatalf("Send = %q, %v; want %q", got.Outcome, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Send = %q, nil; want an error", got.Outcome)
			}
			if isPermanent(err) != tt.perm {
				t.Errorf("Send error %v: permanent %v, want %v", err, isPermanent(err), tt.perm)
			}
			// Only our own shutdown may be excluded from the breaker's
			// count; a slow downstream must count.
			if errors.Is(err, context.Canceled) {
				t.Errorf("Send error %v reads as our own cancellation", err)
			}
			if !strings.Contains(err.Error(), "g1") {
				t.Errorf("Send error %q does not name the guide", err)
			}
		})
	}

	t.Run("connection refused fails", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close()
		s := &gatewaySender{url: srv.URL, secret: testSecret, client: &http.Client{Timeout: time.Second}}
		_, err := s.Send(context.Background(), Guide{ID: "g1", UID: "u1", Text: testText})
		if err == nil || isPermanent(err) {
			t.Fatalf("Send to a closed port: %v; want a retryable error", err)
		}
	})

	t.Run("canceled", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		}))
		defer srv.Close()
		s := &gatewaySender{url: srv.URL, secret: testSecret, client: &http.Client{Timeout: 5 * time.Second}}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		_, err := s.Send(ctx, Guide{ID: "g1", UID: "u1", Text: testText})
		if !errors.Is(err, context.Canceled) || isPermanent(err) {
			t.Fatalf("Send canceled: %v; want context.Canceled, not permanent", err)
		}
	})
}

func TestSenderRequest(t *testing.T) {
	type push struct {
		method, path, contentType, auth string
		body                            map[string]any
	}
	got := make(chan push, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := push{method: r.Method, path: r.URL.Path, contentType: r.Header.Get("Content-Type"), auth: r.Header.Get("Authorization")}
		json.NewDecoder(r.Body).Decode(&p.body)
		got <- p
		w.Write([]byte(`{"status":"delivered"}`))
	}))
	defer srv.Close()
	s := &gatewaySender{url: srv.URL + "/v1/push", secret: testSecret, client: srv.Client()}

	if _, err := s.Send(context.Background(), Guide{ID: "id-1", UID: "user-1", Segment: "vip", Text: testText, DeadlineMS: 1795255600123,
		Stage: 2, Action: "close", Final: true}); err != nil {
		t.Fatal(err)
	}
	p := <-got
	if p.method != http.MethodPost || p.path != "/v1/push" {
		t.Errorf("request %s %s, want POST /v1/push", p.method, p.path)
	}
	if p.contentType != "application/json" {
		t.Errorf("Content-Type %q", p.contentType)
	}
	if p.auth != "Bearer "+testSecret {
		t.Errorf("Authorization %q, want the bearer secret", p.auth)
	}
	want := map[string]any{"id": "id-1", "uid": "user-1", "segment": "vip", "text": testText, "deadline_ms": float64(1795255600123),
		"stage": float64(2), "action": "close", "final": true}
	if len(p.body) != len(want) {
		t.Errorf("body %v, want %v", p.body, want)
	}
	for k, v := range want {
		if p.body[k] != v {
			t.Errorf("body %s = %v, want %v", k, p.body[k], v)
		}
	}
}

func TestWebhookSender(t *testing.T) {
	secret := []byte(strings.Repeat("w", 32))
	tests := []struct {
		name   string
		status int // 0 means never answer
		want   Outcome
		perm   bool
	}{
		{name: "200 delivers", status: 200, want: OutcomeDelivered},
		{name: "202 delivers", status: 202, want: OutcomeDelivered},
		{name: "204 delivers", status: 204, want: OutcomeDelivered},
		{name: "400 is permanent", status: 400, perm: true},
		{name: "404 is permanent", status: 404, perm: true},
		{name: "410 is permanent", status: 410, perm: true},
		{name: "422 is permanent", status: 422, perm: true},
		// A rotated secret or a blocked consumer: every guide gets it,
		// so it is the receiver failing, as on the push endpoint.
		{name: "401 fails", status: 401},
		{name: "403 fails", status: 403},
		{name: "405 fails", status: 405},
		{name: "409 fails", status: 409},
		{name: "408 fails", status: 408},
		{name: "429 fails", status: 429},
		{name: "500 fails", status: 500},
		{name: "503 fails", status: 503},
		{name: "redirect fails", status: 307},
		{name: "timeout fails", status: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if tt.status == 0 {
					<-r.Context().Done()
					return
				}
				if tt.status == 307 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tt.status)
			}))
			defer srv.Close()
			s := &webhookSender{url: srv.URL, secret: secret, client: &http.Client{
				Timeout:       100 * time.Millisecond,
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			}}
			got, err := s.Send(context.Background(), Guide{ID: "g1", UID: "u1", Text: testText})
			if tt.want != "" {
				if err != nil || got.Outcome != tt.want {
					t.Fatalf("Send = %q, %v; want %q", got.Outcome, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Send = %q, nil; want an error", got.Outcome)
			}
			if isPermanent(err) != tt.perm {
				t.Errorf("Send error %v: permanent %v, want %v", err, isPermanent(err), tt.perm)
			}
			if errors.Is(err, context.Canceled) {
				t.Errorf("Send error %v reads as our own cancellation", err)
			}
		})
	}

	t.Run("request", func(t *testing.T) {
		type hook struct {
			method, contentType, key, sig string
			body                          []byte
		}
		got := make(chan hook, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got <- hook{r.Method, r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key"), r.Header.Get("X-Stillthere-Signature"), b}
		}))
		defer srv.Close()
		s := &webhookSender{url: srv.URL, secret: secret, client: srv.Client()}
		g := Guide{ID: "id-1", UID: "user-1", Segment: "vip", Text: "Still with us?", DeadlineMS: 1795255600123,
			Stage: 2, Action: "close", Final: true}
		if _, err := s.Send(context.Background(), g); err != nil {
			t.Fatal(err)
		}
		h := <-got
		if h.method != http.MethodPost || h.contentType != "application/json" || h.key != "id-1" {
			t.Errorf("%s, Content-Type %q, Idempotency-Key %q; want POST, application/json, the guide id", h.method, h.contentType, h.key)
		}
		if err := webhook.Verify(h.sig, h.body, time.Now(), secret); err != nil {
			t.Errorf("signature %q: %v", h.sig, err)
		}
		if webhook.Verify(h.sig, h.body, time.Now(), []byte(strings.Repeat("x", 32))) == nil {
			t.Error("signature does not depend on the secret")
		}
		var body map[string]any
		if err := json.Unmarshal(h.body, &body); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"id": "id-1", "uid": "user-1", "segment": "vip", "text": "Still with us?", "deadline_ms": float64(1795255600123),
			"due_ms": float64(1795255600123), "stage": float64(2), "action": "close", "final": true, "reason": "ended"}
		if !maps.Equal(body, want) {
			t.Errorf("body %v, want %v", body, want)
		}

		// A guide that names no stage is stage 1's reminder, on the
		// webhook too: its receiver always gets all three.
		if _, err := s.Send(context.Background(), Guide{ID: "id-2", UID: "user-1", Text: "Still with us?"}); err != nil {
			t.Fatal(err)
		}
		h = <-got
		var plain webhook.Body
		if err := json.Unmarshal(h.body, &plain); err != nil {
			t.Fatal(err)
		}
		if plain.Stage != 1 || plain.Action != "remind" || plain.Final {
			t.Errorf("body of a guide without a stage %s, want stage 1, remind, not final", h.body)
		}
	})
}

// TestBreaker: failures and timeouts open it, our own cancellation and a
// downstream's definite no do not.
func TestBreaker(t *testing.T) {
	cfg := validConfig()
	cfg.BreakerFailures = 3
	fail := errors.New("503")
	tests := []struct {
		name string
		err  error
		open bool
	}{
		{"failures open it", fail, true},
		{"timeouts open it", context.DeadlineExceeded, true},
		{"cancellation is not counted", context.Canceled, false},
		{"wrapped cancellation is not counted", fmt.Errorf("push: %w", context.Canceled), false},
		{"a permanent no is the downstream answering", permanentError{err: fail}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBreaker[string]("test-"+tt.name, cfg, testLogger())
			for range cfg.BreakerFailures {
				b.Execute(func() (string, error) { return "", tt.err })
			}
			if open := b.State() == gobreaker.StateOpen; open != tt.open {
				t.Errorf("after %d errors %v: open %v, want %v", cfg.BreakerFailures, tt.err, open, tt.open)
			}
		})
	}
}
