package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/timeoutevent/topictest"
)

const (
	testTTL    = 2 * time.Second
	testJitter = 500 * time.Millisecond
)

// startStack runs the whole pipeline in-process on free ports, with a
// child redis-server and an embedded Kafka, and stops it at cleanup.
func startStack(t *testing.T, extra map[string]string) *Stack {
	t.Helper()
	env := map[string]string{
		"STILLTHERE_SESSION_TTL":         testTTL.String(),
		"STILLTHERE_SESSION_JITTER":      testJitter.String(),
		"STILLTHERE_GATEWAY_ADDR":        "127.0.0.1:0",
		"STILLTHERE_PUSH_ADDR":           "127.0.0.1:0",
		"STILLTHERE_LISTENER_ADMIN_ADDR": "127.0.0.1:0",
		"STILLTHERE_CONSUMER_ADMIN_ADDR": "127.0.0.1:0",
		"STILLTHERE_TOPIC_PARTITIONS":    "4",
		"STILLTHERE_KEY_PREFIX":          redistest.Prefix(t),
		"STILLTHERE_SWEEP_INTERVAL":      "100ms",
		"STILLTHERE_BREAKER_TIMEOUT":     "1s",
		"STILLTHERE_SHUTDOWN_TIMEOUT":    "3s",
		// One guide per silence, unless a test asks for stages.
		"STILLTHERE_CLOSE_AFTER": "0",
	}
	for k, v := range extra {
		env[k] = v
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	s, err := Start(context.Background(), Options{Env: lookup, DataDir: t.TempDir(), Logger: logger})
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	// The stack is a service as each of its three is: run and stopped
	// the one way the tests run a service.
	lifecycletest.Run(t, "dev stack", s)
	return s
}

func wsURL(s *Stack) string { return "ws://" + s.Gateway.PublicAddr().String() + "/v1/ws" }

func mint(t *testing.T, s *Stack, uid string) string {
	t.Helper()
	tok, err := chatsim.Token([]byte(s.TokenSecret), uid, "")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// dial connects uid to the stack's gateway, and closes the connection at
// cleanup.
func dial(t *testing.T, s *Stack, uid string) *chatsim.Conn {
	t.Helper()
	return connectAs(t, &chatsim.User{UID: uid, Token: mint(t, s, uid)}, wsURL(s))
}

// readFrame returns the next frame that answered no ping.
func readFrame(t *testing.T, c *chatsim.Conn) chatsim.Frame {
	t.Helper()
	f, err := c.Next(5 * time.Second)
	if err != nil {
		t.Fatalf("read frame: %v", err)
	}
	if f.Type == chatsim.NotJSON {
		t.Fatalf("server sent a frame that is not JSON")
	}
	return f
}

// ping sends a ping, checks the pong, and returns the deadline it implies
// (send time plus the TTL granted: never earlier than Redis's deadline).
func ping(t *testing.T, c *chatsim.Conn) time.Time {
	t.Helper()
	a, err := c.PingWait(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A fresh grant is in [TTL, TTL+jitter); a ping within the renewal
	// granularity of the last one is answered with what remains of it.
	if a.Unavailable || a.TTL <= 0 || a.TTL >= testTTL+testJitter {
		t.Fatalf("ping answered with %+v; want a pong with ttl_ms in (0, %d)", a, (testTTL + testJitter).Milliseconds())
	}
	return a.Low()
}

// expectClose waits until the server closes, and checks the close code.
func expectClose(t *testing.T, c *chatsim.Conn, code int) {
	t.Helper()
	select {
	case <-c.Gone():
	case <-time.After(5 * time.Second):
		t.Fatalf("connection still open after 5s, want close code %d", code)
	}
	if err := c.Err(); !websocket.IsCloseError(err, code) {
		t.Fatalf("connection ended with %v, want close code %d", err, code)
	}
}

// topicEvents reads every timeout event on the topic.
func topicEvents(t *testing.T, s *Stack) []timeoutevent.Event {
	t.Helper()
	return topictest.Events(t, []string{s.KafkaBrokers}, s.ListenerConfig.Kafka.Topic)
}

func TestEndToEnd(t *testing.T) {
	s := startStack(t, nil)
	t.Run("contract", func(t *testing.T) { testContract(t, s) })
	t.Run("flow", func(t *testing.T) { testFlow(t, s) })
}

// testFlow: silent clients get exactly one guide shortly after their
// deadline; a client that keeps pinging, or leaves with a normal close,
// gets none; acks do not count as activity.
func testFlow(t *testing.T, s *Stack) {
	const silentN = 20
	type result struct {
		uid      string
		deadline time.Time
		guides   []time.Time
	}
	var (
		mu      sync.Mutex
		results []*result
		wg      sync.WaitGroup
	)
	// listen counts guides until the end of the observation window.
	listen := func(c *chatsim.Conn, r *result, until time.Time, ack bool) {
		defer wg.Done()
		for {
			f, err := c.Next(time.Until(until))
			if err != nil {
				return
			}
			if f.Type == "guide" {
				mu.Lock()
				r.guides = append(r.guides, f.At)
				mu.Unlock()
				if f.Text != "Are you still there?" || f.ID == "" {
					t.Errorf("%s: guide %+v", r.uid, f)
				}
				if ack {
					c.Ack(f.ID)
				}
			}
		}
	}
	window := time.Now().Add(testTTL + testJitter + 4*time.Second)

	for i := range silentN {
		uid := "silent-" + string(rune('a'+i))
		c := dial(t, s, uid)
		r := &result{uid: uid, deadline: ping(t, c)}
		results = append(results, r)
		wg.Add(1)
		go listen(c, r, window, true)
	}

	// The acker pings once, then acks (bookkeeping) every 300ms through the
	// whole window: acks must not renew, so it is still guided on time.
	acker := &result{uid: "acker"}
	{
		c := dial(t, s, acker.uid)
		acker.deadline = ping(t, c)
		wg.Add(2)
		go listen(c, acker, window, false)
		go func() {
			defer wg.Done()
			for time.Now().Before(window) {
				if c.Ack("some-guide") != nil {
					t.Error("acker: write failed")
					return
				}
				pace(300 * time.Millisecond)
			}
		}()
	}

	// The active client keeps pinging through the whole window; any
	// guide on its connection counts against it.
	active := &result{uid: "active"}
	{
		c := dial(t, s, active.uid)
		ping(t, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(window) {
				pace(500 * time.Millisecond)
				if _, err := c.PingWait(5 * time.Second); err != nil {
					t.Errorf("active: %v", err)
					return
				}
			}
			for _, g := range c.Guides() {
				mu.Lock()
				active.guides = append(active.guides, g.At)
				mu.Unlock()
			}
		}()
	}

	// The leaver closes normally: its session is deleted, no timeout.
	{
		c := dial(t, s, "leaver")
		ping(t, c)
		if err := c.Leave(5 * time.Second); err != nil {
			t.Fatalf("leaver: the normal close answered with %v, want close code %d", err, websocket.CloseNormalClosure)
		}
	}
	// The dropper loses its network: no close frame, the session runs out.
	{
		c := dial(t, s, "dropper")
		ping(t, c)
		c.Close()
	}

	wg.Wait()

	var lates []time.Duration
	for _, r := range append(results, acker) {
		if len(r.guides) != 1 {
			t.Errorf("%s got %d guides, want exactly 1", r.uid, len(r.guides))
			continue
		}
		late := r.guides[0].Sub(r.deadline)
		// deadline is the client's upper bound of Redis's; allow the RTT.
		if late < -50*time.Millisecond {
			t.Errorf("%s guided %v before its deadline", r.uid, -late)
		}
		if late > 2*time.Second {
			t.Errorf("%s guided %v after its deadline, want under 2s", r.uid, late)
		}
		lates = append(lates, late)
	}
	if len(active.guides) != 0 {
		t.Errorf("active client got %d guides", len(active.guides))
	}
	slices.Sort(lates)
	if len(lates) > 0 {
		t.Logf("guide latency past the deadline over %d clients: p50 %v, max %v",
			len(lates), lates[len(lates)/2].Round(time.Millisecond), lates[len(lates)-1].Round(time.Millisecond))
	}

	// What reached Kafka: one event per silence, none for the active
	// client or the leaver.
	perUID := map[string]int{}
	for _, ev := range topicEvents(t, s) {
		perUID[ev.UID]++
		if ev.DetectedMS < ev.DeadlineMS {
			t.Errorf("%s: detected %dms before its deadline", ev.UID, ev.DeadlineMS-ev.DetectedMS)
		}
	}
	for _, r := range append(results, acker) {
		if perUID[r.uid] != 1 {
			t.Errorf("%s: %d events on the topic, want 1", r.uid, perUID[r.uid])
		}
	}
	if perUID["dropper"] != 1 {
		t.Errorf("dropper: %d events, want 1 (its session runs out)", perUID["dropper"])
	}
	// The dropper was offline when its guide went out: it was kept, and
	// comes first on the next connect.
	if f := readFrame(t, dial(t, s, "dropper")); f.Type != "guide" || f.Text != "Are you still there?" {
		t.Errorf("dropper on reconnect: %+v, want its kept guide", f)
	}
	for _, uid := range []string{"active", "leaver"} {
		if perUID[uid] != 0 {
			t.Errorf("%s: %d events on the topic, want none", uid, perUID[uid])
		}
	}
}

func testContract(t *testing.T, s *Stack) {
	secret := []byte(s.TokenSecret)
	signed := func(method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
		tok, err := jwt.NewWithClaims(method, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	exp := time.Now().Add(time.Hour).Unix()
	none := signed(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": "u", "exp": exp})

	t.Run("rejected before upgrade", func(t *testing.T) {
		tests := []struct {
			name   string
			header http.Header
			query  string
			status int
		}{
			{"no token", nil, "", 401},
			{"malformed token", http.Header{"Authorization": {"Bearer abc"}}, "", 401},
			{"not bearer", http.Header{"Authorization": {"Basic abc"}}, "", 401},
			{"expired", http.Header{"Authorization": {"Bearer " + signed(jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "u", "exp": time.Now().Add(-time.Hour).Unix()})}}, "", 401},
			{"wrong secret", http.Header{"Authorization": {"Bearer " + signed(jwt.SigningMethodHS256, []byte(strings.Repeat("k", 32)), jwt.MapClaims{"sub": "u", "exp": exp})}}, "", 401},
			{"alg none", http.Header{"Authorization": {"Bearer " + none}}, "", 401},
			{"no exp", http.Header{"Authorization": {"Bearer " + signed(jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "u"})}}, "", 401},
			{"bad sub", http.Header{"Authorization": {"Bearer " + signed(jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a/b", "exp": exp})}}, "", 401},
			{"bad query token", nil, "?token=abc", 401},
			{"foreign origin", http.Header{"Authorization": {"Bearer " + mint(t, s, "u")}, "Origin": {"https://evil.example"}}, "", 403},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				// The header as the table has it: no token of the user's.
				u := &chatsim.User{UID: "u", Header: tt.header}
				c, err := u.Connect(context.Background(), wsURL(s)+tt.query)
				if err == nil {
					c.Close()
					t.Fatal("upgrade succeeded")
				}
				var refused *chatsim.RefusedError
				if !errors.As(err, &refused) || refused.Status != tt.status {
					t.Fatalf("got %v, want HTTP %d", err, tt.status)
				}
				var body struct{ Error string }
				if json.Unmarshal(refused.Body, &body) != nil || body.Error == "" {
					t.Fatalf("body %q is not {\"error\": ...}", refused.Body)
				}
			})
		}
	})

	t.Run("query token and same-host origin", func(t *testing.T) {
		u := &chatsim.User{UID: "browser", Header: http.Header{"Origin": {"http://" + s.Gateway.PublicAddr().String()}}}
		ping(t, connectAs(t, u, wsURL(s)+"?token="+mint(t, s, "browser")))
	})

	t.Run("unknown type keeps the connection", func(t *testing.T) {
		c := dial(t, s, "unknown")
		c.WriteRaw(websocket.TextMessage, []byte(`{"type":"hello"}`))
		if f := readFrame(t, c); f.Type != "error" || f.Code != "unknown_type" {
			t.Fatalf("got %+v, want error unknown_type", f)
		}
		ping(t, c)
	})

	closes := []struct {
		name string
		send func(c *chatsim.Conn)
		code int
	}{
		{"oversized", func(c *chatsim.Conn) {
			c.WriteRaw(websocket.TextMessage, []byte(`{"type":"ping","pad":"`+strings.Repeat("x", 5000)+`"}`))
		}, websocket.CloseMessageTooBig},
		{"binary", func(c *chatsim.Conn) {
			c.WriteRaw(websocket.BinaryMessage, []byte(`{"type":"ping"}`))
		}, websocket.CloseUnsupportedData},
		{"invalid json", func(c *chatsim.Conn) {
			c.WriteRaw(websocket.TextMessage, []byte(`{"type":`))
		}, websocket.CloseInvalidFramePayloadData},
		{"flood", func(c *chatsim.Conn) {
			for range 40 {
				if c.WriteRaw(websocket.TextMessage, []byte(`{"type":"nope"}`)) != nil {
					return
				}
			}
		}, websocket.ClosePolicyViolation},
	}
	for _, tt := range closes {
		t.Run("close "+tt.name, func(t *testing.T) {
			c := dial(t, s, "closer-"+strings.ReplaceAll(tt.name, " ", "-"))
			tt.send(c)
			expectClose(t, c, tt.code)
		})
	}

	t.Run("burst within the limit is served", func(t *testing.T) {
		c := dial(t, s, "burster")
		for range 20 {
			c.WriteRaw(websocket.TextMessage, []byte(`{"type":"nope"}`))
		}
		for range 20 {
			if f := readFrame(t, c); f.Code != "unknown_type" {
				t.Fatalf("got %+v", f)
			}
		}
	})
}
