package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/promise"
	"github.com/stillthere/stillthere/pkg/token"
)

// TestDevicesGetFreshTokens: a run longer than a token's life must not
// cut every device off as its token runs out (an hour-long run once did,
// and the checker took the refused pings for silences): each period,
// every device's later dials carry a fresh token.
func TestDevicesGetFreshTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		secret := "test-secret-of-32-bytes-or-more!!"
		first, err := chatsim.Token([]byte(secret), "ws-000", "")
		if err != nil {
			t.Fatal(err)
		}
		d := &device{chat: &chatsim.User{UID: "ws-000", Token: first}}
		c := &crowd{r: &rig{tokenSecret: secret}, users: []*user{{uid: "ws-000", devices: []*device{d}}}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go c.refreshTokens(ctx, 20*time.Minute)

		time.Sleep(70 * time.Minute) // the fake clock: past the first token's hour
		synctest.Wait()
		v, err := token.NewVerifier([]byte(secret), token.Rules{})
		if err != nil {
			t.Fatal(err)
		}
		claims, err := v.Verify(d.chat.CurrentToken())
		if err != nil {
			t.Fatalf("the device's token after 70 min: %v", err)
		}
		if claims.UID != "ws-000" || !claims.Expires.After(time.Now().Add(45*time.Minute)) {
			t.Errorf("the device's token after 70 min: %+v, want ws-000's, lasting 45 min more", claims)
		}
	})
}

// activityServer answers the activity posts it gets with answers, one
// each in turn (the last one for the rest), and keeps their bodies. An
// answer of 0 hangs up without a word.
func activityServer(t *testing.T, answers ...int) (*httptest.Server, func() []string) {
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		n := len(bodies)
		bodies = append(bodies, string(b))
		mu.Unlock()
		switch code := answers[min(n, len(answers)-1)]; code {
		case 0:
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		case http.StatusServiceUnavailable:
			w.Header().Set("Retry-After", "1") // as the gateway answers
			w.WriteHeader(code)
		default:
			w.WriteHeader(code)
			w.Write([]byte(`{"applied":1,"stale":0}`))
		}
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(bodies)
	}
}

// postOnce has c post one event of u's through srv and returns the
// signal recorded.
func postOnce(t *testing.T, srv *httptest.Server, ev activity) (promise.Signal, time.Duration) {
	t.Helper()
	rec := &recorder{}
	c := &crowd{r: &rig{activitySecret: "s"}, rec: rec, ttl: 4 * time.Second, postURL: func(int) string { return srv.URL }}
	u := &user{uid: "act-059"}
	start := time.Now()
	c.post(context.Background(), u, ev)
	took := time.Since(start)
	h := rec.history(time.Now())
	if len(h.Signals) != 1 {
		t.Fatalf("%d signals recorded, want the event's one: %+v", len(h.Signals), h.Signals)
	}
	return h.Signals[0], took
}

// TestActivityResentWhileRefused: a batch the endpoint refuses with 503
// (Redis out of reach, say restarted without its data) is sent again, the
// same event with the same at_ms, as the protocol asks of a platform; an
// hour-long run once saw a refused post never resent, and the session it
// would have recreated never was. The history has one signal, at its
// at_ms, answered when the resend was.
func TestActivityResentWhileRefused(t *testing.T) {
	srv, bodies := activityServer(t, http.StatusServiceUnavailable, http.StatusOK)
	s, took := postOnce(t, srv, activity{kind: promise.Ping})
	got := bodies()
	if len(got) != 2 || got[0] != got[1] {
		t.Fatalf("posts %q, want the refused batch and the same batch again", got)
	}
	var b struct {
		Events []struct {
			AtMS int64 `json:"at_ms"`
		} `json:"events"`
	}
	if err := json.Unmarshal([]byte(got[0]), &b); err != nil || len(b.Events) != 1 {
		t.Fatalf("body %s: %v", got[0], err)
	}
	if s.Outcome != promise.Answered || s.Sent.UnixMilli() != b.Events[0].AtMS ||
		!s.Deadline.Equal(time.UnixMilli(b.Events[0].AtMS).Add(4*time.Second)) {
		t.Fatalf("signal %+v, want answered, sent at the event's at_ms %d, its deadline a TTL after", s, b.Events[0].AtMS)
	}
	// The resend waited the answer's Retry-After.
	if wait := s.Answered.Sub(s.Sent); wait < time.Second || took > resendWithin+time.Second {
		t.Fatalf("answered %v after the first try (took %v), want after the Retry-After (1s), within %v", wait, took, resendWithin)
	}
}

// TestActivityGivenUpRefused: a batch refused on every try is given up
// within resendWithin, after more than one try, and recorded refused;
// one whose earlier try went unanswered (it may still apply, late) is
// recorded unanswered, whatever the last try's 503 said.
func TestActivityGivenUpRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answers []int
		want    promise.Outcome
	}{
		{"refused every time", []int{http.StatusServiceUnavailable}, promise.Refused},
		{"unanswered, then refused", []int{0, http.StatusServiceUnavailable}, promise.NoAnswer},
		{"unanswered, then applied", []int{0, http.StatusOK}, promise.Answered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, bodies := activityServer(t, tc.answers...)
			s, took := postOnce(t, srv, activity{kind: promise.TurnToUser})
			if s.Outcome != tc.want || took > resendWithin+time.Second {
				t.Fatalf("signal %+v after %v, want %v within %v", s, took, tc.want, resendWithin)
			}
			if n := len(bodies()); n < 2 {
				t.Fatalf("%d tries, want the batch sent again", n)
			}
		})
	}
}
