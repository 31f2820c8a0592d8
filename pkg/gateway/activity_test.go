package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/stillthere/stillthere/pkg/activity"
	"github.com/stillthere/stillthere/pkg/outage"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

const activitySecret = "activity-secret-activity-secret-0"

// fakeActivity is a store that records what it is asked; its function
// field, when set, answers instead of the default (every event applied).
type fakeActivity struct {
	apply func(events []activityEvent) (activityResult, error)

	mu        sync.Mutex
	applied   [][]activityEvent
	instances []string
	rules     []session.SegmentRules
}

var _ activityStore = (*fakeActivity)(nil)

func (f *fakeActivity) ApplyActivity(ctx context.Context, instance string, rules session.SegmentRules, events []activityEvent) (activityResult, error) {
	f.mu.Lock()
	f.applied = append(f.applied, slices.Clone(events))
	f.instances = append(f.instances, instance)
	f.rules = append(f.rules, rules)
	f.mu.Unlock()
	if f.apply != nil {
		return f.apply(events)
	}
	return activityResult{Applied: len(events)}, nil
}

func (f *fakeActivity) calls() [][]activityEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.applied)
}

// activityPolicy: TTL 10s with a jitter of 1s, and a segment vip of 30s.
var activityPolicy = policy.Policy{DefaultTTL: 10 * time.Second, Jitter: time.Second, Segments: map[string]time.Duration{"vip": 30 * time.Second},
	Clocks: map[string]session.Clock{"vip": session.ClockTurn}}

// activityNow is the handler's clock in these tests.
var activityNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newActivityHandler(store activityStore, p policy.Policy) *activityHandler {
	return &activityHandler{
		secret:   activitySecret,
		store:    store,
		policy:   func() policy.Policy { return p },
		instance: "gw-test",
		now:      func() time.Time { return activityNow },
		log:      outage.NewLog(slog.New(slog.NewTextHandler(io.Discard, nil)), "apply activity", 0),
	}
}

// postActivity sends body to h as a platform does, with mutate applied
// to the request, and returns the answer.
func postActivity(h http.Handler, body string, mutate func(*http.Request)) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, activity.Path, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+activitySecret)
	r.Header.Set("Content-Type", "application/json")
	if mutate != nil {
		mutate(r)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// answer decodes an answer, which must be JSON unless it is a 404.
func answer(t *testing.T, w *httptest.ResponseRecorder) (activity.Response, activity.ErrorResponse) {
	t.Helper()
	var ok activity.Response
	var bad activity.ErrorResponse
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%d answered with Content-Type %q: %s", w.Code, ct, w.Body)
	}
	dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
	dec.DisallowUnknownFields()
	var err error
	if w.Code == http.StatusOK {
		err = dec.Decode(&ok)
	} else {
		err = dec.Decode(&bad)
	}
	if err != nil {
		t.Fatalf("%d answered %s: %v", w.Code, w.Body, err)
	}
	return ok, bad
}

func events(es ...string) string { return `{"events":[` + strings.Join(es, ",") + `]}` }

func counter(t *testing.T, kind, outcome string) float64 {
	t.Helper()
	var m dto.Metric
	if err := metricActivityEvents.WithLabelValues(kind, outcome).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestActivityOff(t *testing.T) {
	for name, h := range map[string]*activityHandler{
		"no secret": func() *activityHandler {
			h := newActivityHandler(&fakeActivity{}, activityPolicy)
			h.secret = ""
			return h
		}(),
		"no store": newActivityHandler(nil, activityPolicy),
	} {
		t.Run(name, func(t *testing.T) {
			for _, method := range []string{http.MethodPost, http.MethodGet} {
				w := postActivity(h, events(`{"uid":"u","kind":"active"}`), func(r *http.Request) { r.Method = method })
				if w.Code != http.StatusNotFound {
					t.Fatalf("%s: %d %s, want 404", method, w.Code, w.Body)
				}
			}
		})
	}
}

func TestActivityMethod(t *testing.T) {
	f := &fakeActivity{}
	h := newActivityHandler(f, activityPolicy)
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodHead} {
		w := postActivity(h, events(`{"uid":"u","kind":"active"}`), func(r *http.Request) { r.Method = method })
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != http.MethodPost {
			t.Fatalf("%s: %d, Allow %q; want 405 with Allow POST", method, w.Code, w.Header().Get("Allow"))
		}
	}
	if len(f.calls()) != 0 {
		t.Fatal("applied on another method")
	}
}

func TestActivityAuth(t *testing.T) {
	f := &fakeActivity{}
	h := newActivityHandler(f, activityPolicy)
	for name, auth := range map[string]string{
		"none":            "",
		"wrong":           "Bearer " + strings.Repeat("x", len(activitySecret)),
		"prefix":          "Bearer " + activitySecret[:len(activitySecret)-1],
		"longer":          "Bearer " + activitySecret + "0",
		"the push secret": "Bearer " + pushSecret,
		"not bearer":      "Basic " + activitySecret,
		"bare secret":     activitySecret,
	} {
		t.Run(name, func(t *testing.T) {
			w := postActivity(h, events(`{"uid":"u","kind":"active"}`), func(r *http.Request) {
				r.Header.Del("Authorization")
				if auth != "" {
					r.Header.Set("Authorization", auth)
				}
			})
			if w.Code != http.StatusUnauthorized || !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("%d, WWW-Authenticate %q; want 401 asking for a bearer", w.Code, w.Header().Get("WWW-Authenticate"))
			}
			if _, e := answer(t, w); !strings.Contains(e.Error, "credentials") {
				t.Fatalf("error %q", e.Error)
			}
		})
	}
	// A secret in the query string is not a credential.
	w := postActivity(h, events(`{"uid":"u","kind":"active"}`), func(r *http.Request) {
		r.Header.Del("Authorization")
		r.URL.RawQuery = "access_token=" + activitySecret
	})
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("secret in the query: %d, want 401", w.Code)
	}
	if len(f.calls()) != 0 {
		t.Fatal("applied without the secret")
	}
}

func TestActivityContentType(t *testing.T) {
	for _, tt := range []struct {
		ct   string
		code int
	}{
		{"", http.StatusOK},
		{"application/json", http.StatusOK},
		{"application/json; charset=utf-8", http.StatusOK},
		{"Application/JSON; charset=UTF-8", http.StatusOK},
		{"application/vnd.platform+json", http.StatusOK},
		{"text/plain", http.StatusUnsupportedMediaType},
		{"application/x-www-form-urlencoded", http.StatusUnsupportedMediaType},
		{"application/json; charset=latin1", http.StatusUnsupportedMediaType},
		{"application/jsonx", http.StatusUnsupportedMediaType},
		{"json", http.StatusUnsupportedMediaType},
	} {
		f := &fakeActivity{}
		w := postActivity(newActivityHandler(f, activityPolicy), events(`{"uid":"u","kind":"active"}`), func(r *http.Request) {
			r.Header.Del("Content-Type")
			if tt.ct != "" {
				r.Header.Set("Content-Type", tt.ct)
			}
		})
		if w.Code != tt.code {
			t.Errorf("Content-Type %q: %d %s, want %d", tt.ct, w.Code, w.Body, tt.code)
		}
		if applied := len(f.calls()) > 0; applied != (tt.code == http.StatusOK) {
			t.Errorf("Content-Type %q: applied %v", tt.ct, applied)
		}
	}
}

// TestActivityBodyCap: a body past MaxBodyBytes, said or not in its
// Content-Length, and a batch of more than MaxEvents events are 413,
// and nothing of them applied.
func TestActivityBodyCap(t *testing.T) {
	one := `{"uid":"u","kind":"active"}`
	padded := events(one) + strings.Repeat(" ", activity.MaxBodyBytes)
	for name, tt := range map[string]struct {
		body   string
		mutate func(*http.Request)
	}{
		"past the byte cap":                {padded, nil},
		"past the byte cap, length unsaid": {padded, func(r *http.Request) { r.ContentLength = -1; r.Body = io.NopCloser(r.Body) }},
		"1001 events":                      {events(slices.Repeat([]string{one}, activity.MaxEvents+1)...), nil},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeActivity{}
			before := counter(t, "unknown", "refused")
			w := postActivity(newActivityHandler(f, activityPolicy), tt.body, tt.mutate)
			if w.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("%d %s, want 413", w.Code, w.Body)
			}
			if _, e := answer(t, w); e.Error == "" {
				t.Fatal("no error")
			}
			if len(f.calls()) != 0 {
				t.Fatal("applied")
			}
			if got := counter(t, "unknown", "refused") - before; got != 1 {
				t.Fatalf("refused counted %v times, want 1", got)
			}
		})
	}
	// At the caps: 1000 events, and a body of MaxBodyBytes.
	at := events(slices.Repeat([]string{one}, activity.MaxEvents)...)
	at += strings.Repeat(" ", activity.MaxBodyBytes-len(at))
	f := &fakeActivity{}
	if w := postActivity(newActivityHandler(f, activityPolicy), at, nil); w.Code != http.StatusOK {
		t.Fatalf("1000 events in %d bytes: %d %s", len(at), w.Code, w.Body)
	}
	if c := f.calls(); len(c) != 1 || len(c[0]) != activity.MaxEvents {
		t.Fatalf("applied %d calls", len(c))
	}
}

// TestActivityBadEvent: one bad event refuses the batch whole, with its
// index and field, and nothing of it is applied.
func TestActivityBadEvent(t *testing.T) {
	ok := `{"uid":"u","kind":"active"}`
	for _, tt := range []struct {
		name, body string
		index      *int
		field      string
	}{
		{"bad to at 3 of 5", events(ok, ok, ok, `{"uid":"u","kind":"turn","to":"them"}`, ok), ptr(3), "to"},
		{"bad uid at 0", events(`{"uid":"a b","kind":"active"}`, ok), ptr(0), "uid"},
		{"max_ms out of range", events(ok, `{"uid":"u","kind":"turn","to":"us","max_ms":86400001}`), ptr(1), "max_ms"},
		{"unknown kind", events(`{"uid":"u","kind":"typing"}`), ptr(0), "kind"},
		{"missing field", events(`{"kind":"end"}`), ptr(0), "uid"},
		{"no events", `{"events":[]}`, nil, "events"},
		{"not JSON", `events`, nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeActivity{}
			w := postActivity(newActivityHandler(f, activityPolicy), tt.body, nil)
			if w.Code != http.StatusBadRequest {
				t.Fatalf("%d %s, want 400", w.Code, w.Body)
			}
			_, e := answer(t, w)
			if (e.Index == nil) != (tt.index == nil) || (e.Index != nil && *e.Index != *tt.index) || e.Field != tt.field || e.Error == "" {
				t.Fatalf("answer %s, want index %v and field %q", w.Body, deref(tt.index), tt.field)
			}
			if len(f.calls()) != 0 {
				t.Fatal("the store was called")
			}
		})
	}
	w := postActivity(newActivityHandler(&fakeActivity{}, activityPolicy), events(ok, ok, ok, `{"uid":"u","kind":"turn","to":"them"}`, ok), nil)
	if _, e := answer(t, w); e.Error != `events[3].to: want "user" or "us"` {
		t.Fatalf("error %q", e.Error)
	}
	// at_ms is judged by the handler's clock.
	w = postActivity(newActivityHandler(&fakeActivity{}, activityPolicy), events(fmt.Sprintf(`{"uid":"u","kind":"active","at_ms":%d}`, activityNow.Add(25*time.Hour).UnixMilli())), nil)
	if _, e := answer(t, w); w.Code != http.StatusBadRequest || e.Field != "at_ms" {
		t.Fatalf("at_ms a day ahead of the clock: %d %s", w.Code, w.Body)
	}
}

func ptr(i int) *int { return &i }

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestActivityApplied: a batch becomes the store's events, in order, in
// one call as this instance: kinds, times, holds, the segments (given,
// else left to the store, with the policy's rules and no TTL: the store
// resolves the user's current one, else the default), and the answer is
// the store's count.
func TestActivityApplied(t *testing.T) {
	at := activityNow.Add(-time.Minute)
	f := &fakeActivity{
		apply: func(events []activityEvent) (activityResult, error) { return activityResult{Applied: 4, Stale: 1}, nil },
	}
	before := counter(t, "mixed", "applied")
	beforeStale := counter(t, "mixed", "stale")
	w := postActivity(newActivityHandler(f, activityPolicy), events(
		fmt.Sprintf(`{"uid":"a","kind":"turn","to":"us","seg":"vip","max_ms":90000,"at_ms":%d,"id":"e1"}`, at.UnixMilli()),
		`{"uid":"b","kind":"turn","to":"user"}`,
		`{"uid":"c","kind":"active"}`,
		`{"uid":"b","kind":"active"}`,
		`{"uid":"d","kind":"end","seg":"other"}`,
	), nil)
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if res, _ := answer(t, w); res != (activity.Response{Applied: 4, Stale: 1}) {
		t.Fatalf("answer %+v", res)
	}
	if !slices.Equal(f.instances, []string{"gw-test"}) {
		t.Fatalf("applied as %v", f.instances)
	}
	if len(f.rules) != 1 || fmt.Sprint(f.rules[0]) != fmt.Sprint(activityPolicy.Rules()) {
		t.Fatalf("rules %v, want the policy's %v", f.rules, activityPolicy.Rules())
	}
	calls := f.calls()
	if len(calls) != 1 {
		t.Fatalf("%d calls", len(calls))
	}
	type want struct {
		uid, seg string
		kind     activityKind
		clock    session.Clock
		at       time.Time
		hold     time.Duration
	}
	for i, w := range []want{
		{"a", "vip", activityTurnUs, session.ClockTurn, at, 90 * time.Second},
		{"b", "", activityTurnUser, "", time.Time{}, 0},
		{"c", "", activityActive, "", time.Time{}, 0},
		{"b", "", activityActive, "", time.Time{}, 0},
		{"d", "other", activityEnd, session.ClockPresence, time.Time{}, 0},
	} {
		e := calls[0][i]
		if e.UID != w.uid || e.Segment != w.seg || e.Kind != w.kind || !e.At.Equal(w.at) || e.MaxHold != w.hold || e.Clock != w.clock {
			t.Errorf("event %d: %+v, want %+v", i, e, w)
		}
		// Of no segment: no TTL, the store's to resolve, and a jitter.
		if unsure := w.seg == ""; unsure != (e.TTL == 0) || e.Jitter < 0 || e.Jitter >= activityPolicy.Jitter {
			t.Errorf("event %d: TTL %v, jitter %v; want a TTL only with a segment, a jitter under %v", i, e.TTL, e.Jitter, activityPolicy.Jitter)
		}
	}
	if got := counter(t, "mixed", "applied") - before; got != 4 {
		t.Errorf("applied counted %v, want 4", got)
	}
	if got := counter(t, "mixed", "stale") - beforeStale; got != 1 {
		t.Errorf("stale counted %v, want 1", got)
	}

	// One kind: counted as it.
	f = &fakeActivity{}
	before = counter(t, "turn_user", "applied")
	w = postActivity(newActivityHandler(f, activityPolicy), events(`{"uid":"a","kind":"turn","to":"user","seg":"s"}`, `{"uid":"b","kind":"turn","to":"user","seg":"s"}`), nil)
	if res, _ := answer(t, w); w.Code != http.StatusOK || res != (activity.Response{Applied: 2}) {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if got := counter(t, "turn_user", "applied") - before; got != 2 {
		t.Errorf("turn_user applied counted %v, want 2", got)
	}
}

// TestActivityTTL: each event carries the TTL a ping in its segment
// would be granted: the policy's TTL for the segment plus a jitter in
// [0, Jitter), in whole milliseconds, drawn for each event.
func TestActivityTTL(t *testing.T) {
	body := func(seg string, n int) string {
		e := `{"uid":"u","kind":"active","seg":"` + seg + `"}`
		return events(slices.Repeat([]string{e}, n)...)
	}
	for _, tt := range []struct {
		name string
		p    policy.Policy
		seg  string
		ttl  time.Duration
	}{
		{"default", activityPolicy, "default", 10 * time.Second},
		{"segment not listed", activityPolicy, "other", 10 * time.Second},
		{"segment listed", activityPolicy, "vip", 30 * time.Second},
		{"no jitter", policy.Policy{DefaultTTL: 45 * time.Second}, "vip", 45 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeActivity{}
			if w := postActivity(newActivityHandler(f, tt.p), body(tt.seg, 200), nil); w.Code != http.StatusOK {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			seen := map[time.Duration]bool{}
			for _, e := range f.calls()[0] {
				if e.TTL < tt.ttl || e.TTL >= tt.ttl+max(tt.p.Jitter, time.Nanosecond) || e.TTL%time.Millisecond != 0 {
					t.Fatalf("TTL %v, want %v plus a jitter in [0, %v) in whole ms", e.TTL, tt.ttl, tt.p.Jitter)
				}
				seen[e.TTL] = true
			}
			// 200 draws of 1000 ms: all the same only if no jitter is drawn.
			if spread := len(seen) > 1; spread != (tt.p.Jitter > 0) {
				t.Fatalf("%d distinct TTLs over 200 events with jitter %v", len(seen), tt.p.Jitter)
			}
		})
	}
}

// TestActivityUnavailable: when the store fails, the answer is 503 with
// Retry-After, and the failure is counted for the batch's kind.
func TestActivityUnavailable(t *testing.T) {
	down := errors.New("redis: connection refused")
	for name, f := range map[string]*fakeActivity{
		"apply": {apply: func([]activityEvent) (activityResult, error) { return activityResult{}, down }},
	} {
		t.Run(name, func(t *testing.T) {
			before := counter(t, "end", "failed")
			w := postActivity(newActivityHandler(f, activityPolicy), events(`{"uid":"u","kind":"end"}`, `{"uid":"v","kind":"end"}`), nil)
			if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
				t.Fatalf("%d, Retry-After %q: want 503 with Retry-After 1", w.Code, w.Header().Get("Retry-After"))
			}
			if _, e := answer(t, w); !strings.Contains(e.Error, "retry") || strings.Contains(e.Error, "refused") {
				t.Fatalf("error %q: want a retry, without Redis's words", e.Error)
			}
			if got := counter(t, "end", "failed") - before; got != 2 {
				t.Fatalf("failed counted %v, want 2", got)
			}
		})
	}
}

// TestActivityConfig: activity-secret is optional; when set, at least 32
// bytes and not the push secret, and a bad one names the setting.
func TestActivityConfig(t *testing.T) {
	load := func(secret string, set bool) (Config, error) {
		return LoadConfig(nil, func(k string) (string, bool) {
			env := map[string]string{"STILLTHERE_TOKEN_SECRET": tokenSecret, "STILLTHERE_PUSH_SECRET": pushSecret}
			if set {
				env["STILLTHERE_ACTIVITY_SECRET"] = secret
			}
			v, ok := env[k]
			return v, ok
		})
	}
	if c, err := load("", false); err != nil || c.ActivitySecret != "" {
		t.Fatalf("unset: %q, %v", c.ActivitySecret, err)
	}
	if c, err := load(activitySecret, true); err != nil || c.ActivitySecret != activitySecret {
		t.Fatalf("set: %q, %v", c.ActivitySecret, err)
	}
	for secret, want := range map[string]string{
		strings.Repeat("s", 31): "activity-secret: 31 bytes, want at least 32",
		pushSecret:              "activity-secret: the same as push-secret",
	} {
		if _, err := load(secret, true); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error about %q", secret, err, want)
		}
	}
	// The flag too.
	c, err := LoadConfig([]string{"-activity-secret", activitySecret}, func(k string) (string, bool) {
		v, ok := map[string]string{"STILLTHERE_TOKEN_SECRET": tokenSecret, "STILLTHERE_PUSH_SECRET": pushSecret}[k]
		return v, ok
	})
	if err != nil || c.ActivitySecret != activitySecret {
		t.Fatalf("flag: %q, %v", c.ActivitySecret, err)
	}
}

// TestActivityServed: a gateway serves the endpoint on its internal
// listener, applies as its own instance, and grants its live policy's
// TTLs; without a secret the path is 404 there; with the real store an
// active event starts a session.
func TestActivityServed(t *testing.T) {
	f := &fakeActivity{}
	tg := startGatewayHooked(t, []string{redistest.Start(t).Addr}, redistest.Prefix(t), slog.New(slog.NewTextHandler(io.Discard, nil)),
		func(c *Config) { c.ActivitySecret = activitySecret }, func(g *Gateway) { g.activity.store = f })
	stored := policy.Policy{DefaultTTL: 20 * time.Second, Segments: map[string]time.Duration{"vip": 3 * time.Minute}}
	if err := policy.NewStore(tg.rdb, tg.store.Keyspace()).Save(context.Background(), stored); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the gateway to pick up the policy", func() bool { return tg.policy.Current().String() == stored.String() })
	url := "http://" + tg.PushAddr().String() + activity.Path
	post := func(secret string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(events(`{"uid":"u","kind":"active","seg":"vip"}`)))
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if resp := post(activitySecret); resp.StatusCode != http.StatusOK {
		t.Fatalf("%s", resp.Status)
	}
	if resp := post(pushSecret); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("with the push secret: %s", resp.Status)
	}
	if resp, err := http.Get(url); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %v, %v", resp, err)
	}
	calls := f.calls()
	if len(calls) != 1 || calls[0][0].TTL != 3*time.Minute || f.instances[0] != tg.instance {
		t.Fatalf("applied %+v as %v; want a TTL of 3m as %s", calls, f.instances, tg.instance)
	}

	off := startGateway(t, nil)
	resp, err := http.Post("http://"+off.PushAddr().String()+activity.Path, "application/json", strings.NewReader(events(`{"uid":"u","kind":"active"}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("no secret: %s, want 404", resp.Status)
	}

	// The real store: an active event starts a session without any
	// WebSocket, with the TTL of its segment.
	real := startGateway(t, func(c *Config) { c.ActivitySecret = activitySecret })
	req, _ := http.NewRequest(http.MethodPost, "http://"+real.PushAddr().String()+activity.Path,
		strings.NewReader(events(`{"uid":"server-fed","kind":"active"}`)))
	req.Header.Set("Authorization", "Bearer "+activitySecret)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"applied":1`) {
		t.Fatalf("real store: %s %s", resp.Status, body)
	}
	if live, err := real.store.Live(context.Background(), "server-fed"); err != nil || !live {
		t.Fatalf("session of an active event: live %v, %v", live, err)
	}
}
