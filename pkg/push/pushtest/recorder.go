// Package pushtest receives pushes in tests and benches as the gateway's
// push endpoint (package push) does: it checks the bearer secret and the
// request, shows the user each guide id once (answering "delivered", then
// "duplicate"), and records every push it took and when each id was first
// delivered, on which path. A caller can make it fail as a gateway does:
// answer 503 to every push (a fleet that is down), a fixed status to one
// user's pushes, or hold every push unanswered (a gateway that hangs); it
// can run a hook when a guide is first shown, before the answer, and
// reports how many pushes it is answering at once.
package pushtest

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
)

// Push is one guide id the recorder delivered.
type Push struct {
	// Request is the push that delivered it.
	push.Request
	// Path is the request path it was delivered on, which tells apart
	// senders given different URLs of one recorder.
	Path string
	// At is when it was first delivered; Sends counts every push of the
	// id that reached delivery (answered "delivered", then "duplicate").
	// Pushes refused by a fault are counted by Attempts, not here.
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

	mu        sync.Mutex
	byID      map[string]*Push // delivered ids
	attempts  map[string]int   // id: pushes taken, whatever their answer
	texts     map[string]bool  // texts of the pushes taken
	shownTo   map[string]int   // uid: ids delivered to them
	statusFor map[string]int   // uid: the status every push for it gets
	// hold is non-nil while pushes hang; closing it releases them.
	hold        chan struct{}
	afterShow   func(id string)
	badAuth     int       // pushes refused for the secret
	abandoned   int       // held pushes whose client gave up
	serving     int       // pushes taken and not yet answered
	peak        int       // most pushes answered at once
	first, last time.Time // first deliveries since the span was reset
}

// NewRecorder returns a recorder that takes pushes signed with secret.
func NewRecorder(secret string) *Recorder {
	return &Recorder{
		secret:    secret,
		byID:      make(map[string]*Push),
		attempts:  make(map[string]int),
		texts:     make(map[string]bool),
		shownTo:   make(map[string]int),
		statusFor: make(map[string]int),
	}
}

// Start serves a new recorder on a loopback port until cleanup, and
// returns it with the URL to push to (its push.Path).
func Start(t testing.TB, secret string) (*Recorder, string) {
	t.Helper()
	r := NewRecorder(secret)
	srv := httptest.NewServer(r)
	t.Cleanup(func() {
		r.SetHang(false) // a held push would keep Close waiting
		srv.Close()
	})
	return r, srv.URL + push.Path
}

// ServeHTTP answers one push. The checks come in the gateway's order:
// the secret (401), the body (400), then whether it is up (503). A push
// past those is taken (counted by Attempts and Concurrency); then the
// faults the caller set decide: a status for its user, a hang; what is
// left is delivered, once per id.
func (r *Recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || !push.Authorized(req, r.secret) {
		r.mu.Lock()
		r.badAuth++
		r.mu.Unlock()
		push.WriteUnauthorized(w)
		return
	}
	// Read the body to its end: only then does the server notice a
	// client that gives up, which a held push waits for.
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

	r.mu.Lock()
	r.attempts[p.ID]++
	r.texts[p.Text] = true
	r.serving++
	r.peak = max(r.peak, r.serving)
	status, hold := r.statusFor[p.UID], r.hold
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.serving--
		r.mu.Unlock()
	}()

	switch {
	case r.down.Load():
		r.refused.Add(1)
		// No Retry-After: the sender's own backoff and breaker decide
		// when to try again, as with a fleet that answers nothing.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(push.Response{Status: push.Retry, Error: "down"})
		return
	case status != 0:
		http.Error(w, http.StatusText(status), status)
		return
	case hold != nil:
		select {
		case <-hold:
		case <-req.Context().Done():
			r.mu.Lock()
			r.abandoned++
			r.mu.Unlock()
			return
		}
	}

	now := time.Now()
	r.mu.Lock()
	got := r.byID[p.ID]
	if got == nil {
		got = &Push{Request: p, Path: req.URL.Path, At: now}
		r.byID[p.ID] = got
		r.shownTo[p.UID]++
		if r.first.IsZero() {
			r.first = now
		}
		r.last = now
	}
	got.Sends++
	dup := got.Sends > 1
	hook := r.afterShow
	r.mu.Unlock()
	if dup {
		push.WriteSettled(w, push.Duplicate, 0)
		return
	}
	r.delivered.Add(1)
	// The hook runs once the guide is shown and before the sender hears
	// so: a sender that dies here sent a guide it never saw answered.
	if hook != nil {
		hook(p.ID)
	}
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

// SetHang holds every push taken from now on unanswered while hang holds,
// as a gateway that never answers: until SetHang(false) releases the
// held pushes to be delivered, or their client gives up (counted by
// Abandoned).
func (r *Recorder) SetHang(hang bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case hang && r.hold == nil:
		r.hold = make(chan struct{})
	case !hang && r.hold != nil:
		close(r.hold)
		r.hold = nil
	}
}

// OnShown sets a hook run when a guide is first delivered, before its
// push is answered; nil removes it. The hook runs on the push's own
// handler, so the push waits for it.
func (r *Recorder) OnShown(hook func(id string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.afterShow = hook
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

// Shown reports whether id was delivered.
func (r *Recorder) Shown(id string) bool {
	_, ok := r.Get(id)
	return ok
}

// ShownTo counts the ids delivered to uid.
func (r *Recorder) ShownTo(uid string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.shownTo[uid]
}

// Attempts counts the pushes of id taken (past the secret and body
// checks), whatever they were answered: refusals, hangs and duplicates
// included.
func (r *Recorder) Attempts(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[id]
}

// TotalAttempts counts the pushes taken, of every id.
func (r *Recorder) TotalAttempts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.attempts {
		n += a
	}
	return n
}

// Texts returns the texts of the pushes taken, each once, sorted.
func (r *Recorder) Texts() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.texts))
}

// Unauthorized counts the pushes refused for the secret (or the method).
func (r *Recorder) Unauthorized() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.badAuth
}

// Abandoned counts the held pushes whose client gave up waiting.
func (r *Recorder) Abandoned() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.abandoned
}

// Concurrency returns the pushes taken and not yet answered, now and at
// the most since the recorder began.
func (r *Recorder) Concurrency() (now, peak int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.serving, r.peak
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
