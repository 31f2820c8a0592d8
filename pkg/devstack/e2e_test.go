package devstack

import (
	"context"
	"encoding/json"
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

	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/timeoutevent/topictest"
	"github.com/stillthere/stillthere/pkg/token"
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
	tok, err := token.Mint([]byte(s.TokenSecret), uid, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func dial(t *testing.T, s *Stack, uid string) *websocket.Conn {
	t.Helper()
	ws, resp, err := websocket.DefaultDialer.Dial(wsURL(s), http.Header{"Authorization": {"Bearer " + mint(t, s, uid)}})
	if err != nil {
		status := ""
		if resp != nil {
			status = resp.Status
		}
		t.Fatalf("dial as %s: %v %s", uid, err, status)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

type serverFrame struct {
	Type  string `json:"type"`
	TTLMS int64  `json:"ttl_ms"`
	ID    string `json:"id"`
	Text  string `json:"text"`
	Code  string `json:"code"`
}

func readFrame(t *testing.T, ws *websocket.Conn) serverFrame {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	typ, b, err := ws.ReadMessage()
	if err != nil {
		t.Fatalf("read frame: %v", err)
	}
	if typ != websocket.TextMessage {
		t.Fatalf("server sent frame type %d", typ)
	}
	var f serverFrame
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("server frame %q: %v", b, err)
	}
	return f
}

// ping sends a ping, checks the pong, and returns the deadline it implies
// (send time plus the TTL granted: never earlier than Redis's deadline).
func ping(t *testing.T, ws *websocket.Conn) time.Time {
	t.Helper()
	sent := time.Now()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
		t.Fatal(err)
	}
	f := readFrame(t, ws)
	// A fresh grant is in [TTL, TTL+jitter); a ping within the renewal
	// granularity of the last one is answered with what remains of it.
	if f.Type != "pong" || f.TTLMS <= 0 || f.TTLMS >= (testTTL+testJitter).Milliseconds() {
		t.Fatalf("ping answered with %+v; want a pong with ttl_ms in (0, %d)", f, (testTTL + testJitter).Milliseconds())
	}
	return sent.Add(time.Duration(f.TTLMS) * time.Millisecond)
}

// expectClose reads until the server closes, and checks the close code.
func expectClose(t *testing.T, ws *websocket.Conn, code int) {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		_, _, err := ws.ReadMessage()
		if err == nil {
			continue
		}
		if !websocket.IsCloseError(err, code) {
			t.Fatalf("connection ended with %v, want close code %d", err, code)
		}
		return
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
	listen := func(ws *websocket.Conn, r *result, until time.Time, ack bool) {
		defer wg.Done()
		for {
			ws.SetReadDeadline(until)
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			var f serverFrame
			json.Unmarshal(b, &f)
			if f.Type == "guide" {
				mu.Lock()
				r.guides = append(r.guides, time.Now())
				mu.Unlock()
				if f.Text != "Are you still there?" || f.ID == "" {
					t.Errorf("%s: guide %+v", r.uid, f)
				}
				if ack {
					ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ack","id":"`+f.ID+`"}`))
				}
			}
		}
	}
	window := time.Now().Add(testTTL + testJitter + 4*time.Second)

	for i := range silentN {
		uid := "silent-" + string(rune('a'+i))
		ws := dial(t, s, uid)
		r := &result{uid: uid, deadline: ping(t, ws)}
		results = append(results, r)
		wg.Add(1)
		go listen(ws, r, window, true)
	}

	// The acker pings once, then acks (bookkeeping) every 300ms through the
	// whole window: acks must not renew, so it is still guided on time.
	acker := &result{uid: "acker"}
	{
		ws := dial(t, s, acker.uid)
		acker.deadline = ping(t, ws)
		wg.Add(2)
		go listen(ws, acker, window, false)
		go func() {
			defer wg.Done()
			for time.Now().Before(window) {
				if ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ack","id":"some-guide"}`)) != nil {
					t.Error("acker: write failed")
					return
				}
				pace(300 * time.Millisecond)
			}
		}()
	}

	// The active client keeps pinging through the whole window.
	active := &result{uid: "active"}
	{
		ws := dial(t, s, active.uid)
		ping(t, ws)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(window) {
				pace(500 * time.Millisecond)
				ws.SetReadDeadline(time.Now().Add(5 * time.Second))
				if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
					t.Errorf("active: %v", err)
					return
				}
				_, b, err := ws.ReadMessage()
				if err != nil {
					t.Errorf("active: %v", err)
					return
				}
				if strings.Contains(string(b), `"guide"`) {
					mu.Lock()
					active.guides = append(active.guides, time.Now())
					mu.Unlock()
				}
			}
		}()
	}

	// The leaver closes normally: its session is deleted, no timeout.
	{
		ws := dial(t, s, "leaver")
		ping(t, ws)
		ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(time.Second))
		expectClose(t, ws, websocket.CloseNormalClosure)
	}
	// The dropper loses its network: no close frame, the session runs out.
	{
		ws := dial(t, s, "dropper")
		ping(t, ws)
		ws.NetConn().Close()
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
				ws, resp, err := websocket.DefaultDialer.Dial(wsURL(s)+tt.query, tt.header)
				if err == nil {
					ws.Close()
					t.Fatal("upgrade succeeded")
				}
				if resp == nil || resp.StatusCode != tt.status {
					t.Fatalf("got %v, want HTTP %d", resp, tt.status)
				}
				var body struct{ Error string }
				if json.NewDecoder(resp.Body).Decode(&body) != nil || body.Error == "" {
					t.Fatalf("body is not {\"error\": ...}")
				}
			})
		}
	})

	t.Run("query token and same-host origin", func(t *testing.T) {
		h := http.Header{"Origin": {"http://" + s.Gateway.PublicAddr().String()}}
		ws, _, err := websocket.DefaultDialer.Dial(wsURL(s)+"?token="+mint(t, s, "browser"), h)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		ping(t, ws)
	})

	t.Run("unknown type keeps the connection", func(t *testing.T) {
		ws := dial(t, s, "unknown")
		ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello"}`))
		if f := readFrame(t, ws); f.Type != "error" || f.Code != "unknown_type" {
			t.Fatalf("got %+v, want error unknown_type", f)
		}
		ping(t, ws)
	})

	closes := []struct {
		name string
		send func(ws *websocket.Conn)
		code int
	}{
		{"oversized", func(ws *websocket.Conn) {
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping","pad":"`+strings.Repeat("x", 5000)+`"}`))
		}, websocket.CloseMessageTooBig},
		{"binary", func(ws *websocket.Conn) {
			ws.WriteMessage(websocket.BinaryMessage, []byte(`{"type":"ping"}`))
		}, websocket.CloseUnsupportedData},
		{"invalid json", func(ws *websocket.Conn) {
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":`))
		}, websocket.CloseInvalidFramePayloadData},
		{"flood", func(ws *websocket.Conn) {
			for range 40 {
				if ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"nope"}`)) != nil {
					return
				}
			}
		}, websocket.ClosePolicyViolation},
	}
	for _, tt := range closes {
		t.Run("close "+tt.name, func(t *testing.T) {
			ws := dial(t, s, "closer-"+strings.ReplaceAll(tt.name, " ", "-"))
			tt.send(ws)
			expectClose(t, ws, tt.code)
		})
	}

	t.Run("burst within the limit is served", func(t *testing.T) {
		ws := dial(t, s, "burster")
		for range 20 {
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"nope"}`))
		}
		for range 20 {
			if f := readFrame(t, ws); f.Code != "unknown_type" {
				t.Fatalf("got %+v", f)
			}
		}
	})
}
