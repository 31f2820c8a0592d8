// Package pushtest receives pushes in tests and benches as the gateway's
// push endpoint (package push) does: it checks the bearer secret and the
// request, shows the user each guide id once (answering "delivered", then
// "duplicate"), and records when each id was first delivered and how
// often it was sent. A caller can make it answer 503 to every push, as a
// gateway fleet that is down, or a fixed status to one user's pushes.
package pushtest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
)

// Push is one guide id the recorder took.
type Push struct {
	push.Request
	// At is when it was first delivered; Sends counts every push of the
	// id that got past the secret and the down switch, repeats included.
	At    time.Time
	Sends int
}

// Recorder is a push endpoint, an http.Handler. Its methods may be
// called from any goroutine.
type Recorder struct {
	secret    string
	down      atomic.Bool
	delivered atomic.Int64 // ids delivered
	refused   atomic.Int64 // pushes answered 503 while down

	mu          sync.Mutex
	byID        map[string]*Push
	statusFor   map[string]int // uid: the status every push for it gets
	first, last time.Time      // first deliveries since the span was reset
}

// NewRecorder returns a recorder that takes pushes signed with secret.
func NewRecorder(secret string) *Recorder {
	return &Recorder{secret: secret, byID: make(map[string]*Push), statusFor: make(map[string]int)}
}

// Start serves a new recorder on a loopback port until cleanup, and
// returns it with the URL to push to (its push.Path).
func Start(t testing.TB, secret string) (*Recorder, string) {
	t.Helper()
	r := NewRecorder(secret)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return r, srv.URL + push.Path
}

// ServeHTTP answers one push. The checks come in the gateway's order:
// the secret (401), the body (400), then whether it is up (503).
func (r *Recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || !push.Authorized(req, r.secret) {
		push.WriteUnauthorized(w)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, push.MaxBodyBytes))
	if err != nil {
		push.WriteRejected(w, err.Error())
		return
	}
	p, err := push.ParseRequest(body)
	if err != nil {
		push.WriteRejected(w, err.Error())
		return
	}
	if r.down.Load() {
		r.refused.Add(1)
		// No Retry-After: the sender's own backoff and breaker decide
		// when to try again, as with a fleet that answers nothing.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(push.Response{Status: push.Retry, Error: "down"})
		return
	}
	now := time.Now()
	r.mu.Lock()
	status := r.statusFor[p.UID]
	if status != 0 {
		r.mu.Unlock()
		http.Error(w, http.StatusText(status), status)
		return
	}
	got := r.byID[p.ID]
	if got == nil {
		got = &Push{Request: p, At: now}
		r.byID[p.ID] = got
		if r.first.IsZero() {
			r.first = now
		}
		r.last = now
	}
	got.Sends++
	dup := got.Sends > 1
	r.mu.Unlock()
	if dup {
		push.WriteSettled(w, push.Duplicate, 0)
		return
	}
	r.delivered.Add(1)
	push.WriteSettled(w, push.Delivered, 1)
}

// SetDown makes every push after the secret and body checks answered 503
// while down holds.
func (r *Recorder) SetDown(down bool) { r.down.Store(down) }

// SetStatus answers every push for uid with code; 0 ends that.
func (r *Recorder) SetStatus(uid string, code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if code == 0 {
		delete(r.statusFor, uid)
		return
	}
	r.statusFor[uid] = code
}

// Delivered counts the ids delivered so far.
func (r *Recorder) Delivered() int64 { return r.delivered.Load() }

// Refused counts the pushes answered 503 while down.
func (r *Recorder) Refused() int64 { return r.refused.Load() }

// Get returns the push of id, and whether it was delivered.
func (r *Recorder) Get(id string) (Push, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.byID[id]
	if !ok {
		return Push{}, false
	}
	return *p, true
}

// Span is when the first and the last id were first delivered since the
// last ResetSpan.
func (r *Recorder) Span() (first, last time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first, r.last
}

// ResetSpan starts a new span.
func (r *Recorder) ResetSpan() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.first, r.last = time.Time{}, time.Time{}
}

// Resent counts the ids pushed more than once (answered "duplicate", so
// each was shown once).
func (r *Recorder) Resent() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, p := range r.byID {
		if p.Sends > 1 {
			n++
		}
	}
	return n
}
