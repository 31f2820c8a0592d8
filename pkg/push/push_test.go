package push

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const secret = "push-secret-push-secret-push-secret"

func TestParseRequest(t *testing.T) {
	long := strings.Repeat("x", MaxTextLen+1)
	tests := []struct {
		name string
		in   string
		want Request
		bad  string // the field the error names; empty means valid
	}{
		{name: "minimal", in: `{"id":"g1","uid":"alice","text":"Still there?"}`,
			want: Request{ID: "g1", UID: "alice", Text: "Still there?"}},
		{name: "full", in: `{"id":"g1","uid":"a:b@c","segment":"vip","text":"t","deadline_ms":1795255600123}`,
			want: Request{ID: "g1", UID: "a:b@c", Segment: "vip", Text: "t", DeadlineMS: 1795255600123}},
		{name: "unknown fields are ignored", in: `{"id":"g1","uid":"alice","text":"t","priority":"high","v":2}`,
			want: Request{ID: "g1", UID: "alice", Text: "t"}},
		{name: "no id", in: `{"uid":"alice","text":"t"}`, bad: "id"},
		{name: "long id", in: `{"id":"` + strings.Repeat("i", MaxIDLen+1) + `","uid":"alice","text":"t"}`, bad: "id"},
		{name: "bad uid", in: `{"id":"g","uid":"a b","text":"t"}`, bad: "uid"},
		{name: "bad segment", in: `{"id":"g","uid":"a","segment":"a/b","text":"t"}`, bad: "segment"},
		{name: "no text", in: `{"id":"g","uid":"a"}`, bad: "text"},
		{name: "long text", in: `{"id":"g","uid":"a","text":"` + long + `"}`, bad: "text"},
		{name: "detected", in: `{"id":"g1","uid":"alice","text":"t","deadline_ms":1000,"detected_ms":9000}`,
			want: Request{ID: "g1", UID: "alice", Text: "t", DeadlineMS: 1000, DetectedMS: 9000}},
		{name: "negative deadline", in: `{"id":"g","uid":"a","text":"t","deadline_ms":-1}`, bad: "deadline_ms"},
		{name: "negative detected", in: `{"id":"g","uid":"a","text":"t","deadline_ms":1,"detected_ms":-1}`, bad: "detected_ms"},
		{name: "checked", in: `{"id":"g","uid":"a","text":"t","deadline_ms":1,"checked_ms":5}`,
			want: Request{ID: "g", UID: "a", Text: "t", DeadlineMS: 1, CheckedMS: 5}},
		{name: "negative checked", in: `{"id":"g","uid":"a","text":"t","deadline_ms":1,"checked_ms":-1}`, bad: "checked_ms"},
		{name: "deadline of the wrong type", in: `{"id":"g","uid":"a","text":"t","deadline_ms":"soon"}`, bad: "body"},
		{name: "not an object", in: `["g"]`, bad: "body"},
		{name: "trailing data", in: `{"id":"g","uid":"a","text":"t"} {}`, bad: "body"},
		{name: "empty", in: ``, bad: "body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(tt.in))
			if tt.bad == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ParseRequest = %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.bad) {
				t.Fatalf("ParseRequest = %+v, %v; want an error naming %s", got, err, tt.bad)
			}
		})
	}
}

func TestParseResponse(t *testing.T) {
	tests := []struct {
		name       string
		code       int
		retryAfter string
		body       string
		want       Status // settled status, or the Error's status
		conns      int
		skew       bool
		after      time.Duration
	}{
		{name: "delivered", code: 200, body: `{"status":"delivered","connections":2}`, want: Delivered, conns: 2},
		{name: "queued", code: 200, body: `{"status":"queued","connections":0}`, want: Queued},
		{name: "duplicate", code: 200, body: `{"status":"duplicate"}`, want: Duplicate},
		{name: "stale", code: 200, body: `{"status":"stale","connections":0}`, want: Stale},
		{name: "too old", code: 200, body: `{"status":"too_old","connections":0}`, want: TooOld},
		{name: "unknown status is retried", code: 200, body: `{"status":"maybe"}`, want: Retry},
		{name: "200 retry is not settled", code: 200, body: `{"status":"retry"}`, want: Retry},
		{name: "200 not json is retried", code: 200, body: `<html>ok</html>`, want: Retry},
		{name: "claimed", code: 409, retryAfter: "1", body: `{"status":"retry","error":"being pushed"}`, want: Retry, after: time.Second},
		{name: "unavailable", code: 503, retryAfter: "2", body: `{"status":"retry","error":"redis"}`, want: Retry, after: 2 * time.Second},
		{name: "older gateway's 503", code: 503, body: `{"error":"push unavailable, retry"}`, want: Retry},
		{name: "bad request is rejected", code: 400, body: `{"status":"rejected","error":"uid: ..."}`, want: Rejected},
		{name: "bad request without body is rejected", code: 400, want: Rejected},
		{name: "older gateway refusing a field is skew", code: 400,
			body: `{"error":"body: json: unknown field \"deadline_ms\""}`, want: Retry, skew: true},
		{name: "unauthorized is retried", code: 401, body: `{"error":"bad secret"}`, want: Retry},
		{name: "forbidden is retried", code: 403, want: Retry},
		{name: "not found is retried", code: 404, body: `404 page not found`, want: Retry},
		{name: "redirect is retried", code: 307, want: Retry},
		{name: "absurd Retry-After is ignored", code: 503, retryAfter: "99999999", want: Retry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseResponse(tt.code, tt.retryAfter, []byte(tt.body))
			if tt.want.Settled() {
				if err != nil || got.Status != tt.want || got.Connections != tt.conns {
					t.Fatalf("parseResponse = %+v, %v; want %s with %d connections", got, err, tt.want, tt.conns)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("parseResponse = %+v, %v; want an *Error", got, err)
			}
			if e.Status != tt.want || e.Code != tt.code || e.Skew != tt.skew || e.RetryAfter != tt.after {
				t.Fatalf("error %+v; want status %s, code %d, skew %v, Retry-After %v", e, tt.want, tt.code, tt.skew, tt.after)
			}
			if IsRejected(err) != (tt.want == Rejected) {
				t.Fatalf("IsRejected(%v) = %v", err, IsRejected(err))
			}
		})
	}
}

// TestAnswersReadBack: every answer the handler writes is read back as
// the status it was written with.
func TestAnswersReadBack(t *testing.T) {
	for _, tt := range []struct {
		name  string
		write func(http.ResponseWriter)
		want  Status
	}{
		{"settled", func(w http.ResponseWriter) { WriteSettled(w, Delivered, 3) }, Delivered},
		{"too old", func(w http.ResponseWriter) { WriteSettled(w, TooOld, 0) }, TooOld},
		{"claimed", func(w http.ResponseWriter) { WriteRetry(w, http.StatusConflict, time.Second, "busy") }, Retry},
		{"unavailable", func(w http.ResponseWriter) { WriteRetry(w, http.StatusServiceUnavailable, 0, "down") }, Retry},
		{"rejected", func(w http.ResponseWriter) { WriteRejected(w, "uid: bad") }, Rejected},
		{"unauthorized", WriteUnauthorized, Retry},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tt.write(rec)
			got, err := parseResponse(rec.Code, rec.Header().Get("Retry-After"), rec.Body.Bytes())
			status := got.Status
			var e *Error
			if errors.As(err, &e) {
				status = e.Status
				if e.Status == Retry && rec.Code != http.StatusUnauthorized && e.RetryAfter < time.Second {
					t.Errorf("retry answer without Retry-After: %v", rec.Header())
				}
			}
			if status != tt.want {
				t.Fatalf("%d %s read back as %+v, %v; want %s", rec.Code, rec.Body, got, err, tt.want)
			}
		})
	}
}

func TestClient(t *testing.T) {
	type call struct {
		method, contentType, auth string
		body                      []byte
	}
	calls := make(chan call, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		calls <- call{r.Method, r.Header.Get("Content-Type"), r.Header.Get("Authorization"), b}
		if !Authorized(r, secret) {
			WriteUnauthorized(w)
			return
		}
		WriteSettled(w, Queued, 0)
	}))
	defer srv.Close()
	req := Request{ID: "g1", UID: "alice", Segment: "vip", Text: "Still there?", DeadlineMS: 1795255600123}

	got, err := NewClient(srv.URL+Path, secret, srv.Client()).Push(context.Background(), req)
	if err != nil || got.Status != Queued {
		t.Fatalf("Push = %+v, %v; want queued", got, err)
	}
	c := <-calls
	if c.method != http.MethodPost || c.contentType != "application/json" || c.auth != "Bearer "+secret {
		t.Errorf("%s, Content-Type %q, Authorization %q", c.method, c.contentType, c.auth)
	}
	if back, err := ParseRequest(c.body); err != nil || back != req {
		t.Errorf("the server read %+v, %v; want %+v", back, err, req)
	}

	t.Run("wrong secret is retried", func(t *testing.T) {
		_, err := NewClient(srv.URL, "wrong-wrong-wrong-wrong-wrong-wrong", srv.Client()).Push(context.Background(), req)
		<-calls
		var e *Error
		if !errors.As(err, &e) || e.Status != Retry || e.Code != 401 || !strings.Contains(err.Error(), "g1") {
			t.Fatalf("Push with a wrong secret: %v; want a retry naming the guide", err)
		}
	})
	t.Run("an invalid request is rejected unsent", func(t *testing.T) {
		_, err := NewClient(srv.URL, secret, srv.Client()).Push(context.Background(), Request{ID: "g2", UID: "a b", Text: "t"})
		if !IsRejected(err) {
			t.Fatalf("Push of a bad uid: %v; want rejected", err)
		}
		select {
		case <-calls:
			t.Fatal("an invalid request was sent")
		default:
		}
	})
}

// TestClientAgainstOlderGateway: gateways before this package refused
// unknown fields with 400, which the consumer dead-letters. A consumer
// upgraded first sends segment and deadline_ms; it must retry, not
// dead-letter, until the gateways catch up.
func TestClientAgainstOlderGateway(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The older handler's decoding, as it was.
		var req struct {
			ID   string `json:"id"`
			UID  string `json:"uid"`
			Text string `json:"text"`
		}
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"error": "body: " + err.Error()})
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"status": "delivered", "connections": 1})
	}))
	defer srv.Close()
	c := NewClient(srv.URL, secret, srv.Client())

	_, err := c.Push(context.Background(), Request{ID: "g1", UID: "alice", Segment: "default", Text: "t", DeadlineMS: 1})
	var e *Error
	if !errors.As(err, &e) || e.Status != Retry || !e.Skew || IsRejected(err) {
		t.Fatalf("Push with new fields to an older gateway: %v; want a retry marked as skew", err)
	}
	// What an older consumer sent still settles.
	if got, err := c.Push(context.Background(), Request{ID: "g1", UID: "alice", Text: "t"}); err != nil || got.Status != Delivered {
		t.Fatalf("Push without new fields: %+v, %v", got, err)
	}
}

func TestAuthorized(t *testing.T) {
	for _, tt := range []struct {
		header string
		query  string
		want   bool
	}{
		{"Bearer " + secret, "", true},
		{"Bearer  " + secret + " ", "", true},
		{"", "", false},
		{"Bearer wrong", "", false},
		{secret, "", false},
		{"Basic " + secret, "", false},
		{"", "token=" + secret, false}, // never from the query string
	} {
		r := httptest.NewRequest(http.MethodPost, Path+"?"+tt.query, nil)
		if tt.header != "" {
			r.Header.Set("Authorization", tt.header)
		}
		if got := Authorized(r, secret); got != tt.want {
			t.Errorf("Authorization %q, query %q: %v, want %v", tt.header, tt.query, got, tt.want)
		}
	}
	if Authorized(httptest.NewRequest(http.MethodPost, Path, nil), "") {
		t.Error("an empty secret authorizes a request without one")
	}
	if CheckSecret(strings.Repeat("s", MinSecretLen-1)) == nil || CheckSecret(secret) != nil {
		t.Error("CheckSecret does not apply the minimum length")
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"id":"g1","uid":"alice","text":"t"}`,
		`{"id":"g1","uid":"alice","segment":"vip","text":"t","deadline_ms":1795255600123}`,
		`{"id":"g1","uid":"alice","text":"t","x":{"y":[1]}}`,
		`{"id":1}`, `[]`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted %q, which does not validate: %v", b, err)
		}
		// What the client sends of it, the handler reads back the same.
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseRequest(out)
		if err != nil || back != r {
			t.Fatalf("round trip of %+v: %+v, %v", r, back, err)
		}
	})
}

func FuzzParseResponse(f *testing.F) {
	f.Add(200, "", []byte(`{"status":"delivered","connections":1}`))
	f.Add(400, "", []byte(`{"error":"json: unknown field \"x\""}`))
	f.Add(409, "1", []byte(`{"status":"retry"}`))
	f.Add(503, "x", []byte(`not json`))
	f.Fuzz(func(t *testing.T, code int, retryAfter string, body []byte) {
		r, err := parseResponse(code, retryAfter, body)
		if err == nil {
			if code != http.StatusOK || !r.Status.Settled() || r.Connections < 0 {
				t.Fatalf("settled %d %q as %+v", code, body, r)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) || (e.Status != Retry && e.Status != Rejected) {
			t.Fatalf("error %v is not a retry or rejection", err)
		}
		if e.Status == Rejected && code != http.StatusBadRequest {
			t.Fatalf("%d rejected: only 400 is final", code)
		}
		if e.RetryAfter < 0 || e.RetryAfter > time.Hour {
			t.Fatalf("Retry-After %q read as %v", retryAfter, e.RetryAfter)
		}
	})
}

// TestValidateStage: action, final and reason agree: final exactly on a
// close stage, a reason only the last stage's own, and a notify stage is
// never a push (it goes to the platform's notify webhook).
func TestValidateStage(t *testing.T) {
	base := Request{ID: "g1", UID: "alice", Text: "t", DeadlineMS: 1, Stage: 2}
	for _, tt := range []struct {
		action, reason string
		final, ok      bool
	}{
		{"", "", false, true},
		{"remind", "", false, true},
		{"remind", "inactive", false, true},
		{"", "inactive", false, true},
		{"close", "ended", true, true},
		{"close", "", true, true},
		{"remind", "ended", false, false},
		{"close", "inactive", true, false},
		{"remind", "inactive", true, false},
		{"close", "ended", false, false},
		{"notify", "notify", false, false},
		{"remind", "gone", false, false},
	} {
		r := base
		r.Action, r.Reason, r.Final = tt.action, tt.reason, tt.final
		if err := r.Validate(); (err == nil) != tt.ok {
			t.Errorf("action %q reason %q final %v: %v, want ok %v", tt.action, tt.reason, tt.final, err, tt.ok)
		}
	}
}
