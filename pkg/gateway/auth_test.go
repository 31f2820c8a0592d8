package gateway

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/token"
)

// signToken signs a client token whose connection ends at end: its exp is
// end less the verifier's leeway, so tests need not wait out the leeway.
func signToken(t *testing.T, uid, seg string, end time.Time) string {
	t.Helper()
	c := jwt.MapClaims{"sub": uid, "exp": end.Add(-token.Leeway).Unix()}
	if seg != "" {
		c["seg"] = seg
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(tokenSecret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func dialToken(t *testing.T, tg *testGateway, tok string) *websocket.Conn {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+tg.PublicAddr().String()+"/v1/ws", http.Header{"Authorization": {"Bearer " + tok}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// readUntilClose reads frames until the connection closes, and returns
// the close code and when it came.
func readUntilClose(t *testing.T, ws *websocket.Conn, within time.Duration) (int, time.Time) {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(within))
	for {
		_, _, err := ws.ReadMessage()
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code, time.Now()
		}
		if err != nil {
			t.Fatalf("read: %v, want a close frame", err)
		}
	}
}

func TestTokenExpiryClosesConnection(t *testing.T) {
	tg := startGateway(t, nil)
	t.Run("idle", func(t *testing.T) {
		end := time.Now().Add(time.Second).Truncate(time.Second).Add(time.Second)
		ws := dialToken(t, tg, signToken(t, "idle", "", end))
		code, at := readUntilClose(t, ws, 5*time.Second)
		if code != frame.CloseTokenExpired {
			t.Fatalf("close %d, want %d", code, frame.CloseTokenExpired)
		}
		if at.Before(end) || at.After(end.Add(time.Second)) {
			t.Fatalf("closed %v after the token's end, want within 1s after it", at.Sub(end))
		}
	})
	t.Run("pinging", func(t *testing.T) {
		// Activity does not stretch a token: the pings stop being
		// renewals at its end.
		end := time.Now().Add(time.Second).Truncate(time.Second).Add(time.Second)
		ws := dialToken(t, tg, signToken(t, "busy", "", end))
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(250 * time.Millisecond): // under the rate limit
					if ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)) != nil {
						return
					}
				}
			}
		}()
		ws.SetReadDeadline(time.Now().Add(5 * time.Second))
		var lastPong time.Time
		for {
			_, b, err := ws.ReadMessage()
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				if ce.Code != frame.CloseTokenExpired {
					t.Fatalf("close %d, want %d", ce.Code, frame.CloseTokenExpired)
				}
				break
			}
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if f, _ := frame.Parse(b); f.Type == frame.TypePong {
				lastPong = time.Now()
			}
		}
		if lastPong.IsZero() || lastPong.After(end.Add(100*time.Millisecond)) {
			t.Fatalf("last pong %v after the token's end, want none after it", lastPong.Sub(end))
		}
		pttl, err := tg.rdb.PTTL(context.Background(), tg.store.Keyspace().SessionKey("busy")).Result()
		if err != nil {
			t.Fatal(err)
		}
		// The session runs from the last renewal before the end, so it
		// ends no later than end + TTL + jitter (11s in these tests).
		if left := time.Until(end) + 11*time.Second; pttl > left+100*time.Millisecond {
			t.Fatalf("session has %v left, renewed after the token's end (at most %v)", pttl, left)
		}
	})
}

func TestAuthFrameRefreshesToken(t *testing.T) {
	tg := startGateway(t, nil)
	end := time.Now().Add(time.Second).Truncate(time.Second).Add(time.Second)
	ws := dialToken(t, tg, signToken(t, "alice", "vip", end))
	send := func(tok string) map[string]any {
		t.Helper()
		if err := ws.WriteJSON(map[string]string{"type": "auth", "token": tok}); err != nil {
			t.Fatal(err)
		}
		return readJSON(t, ws)
	}
	refused := []struct {
		name, tok string
	}{
		{"another user", signToken(t, "bob", "vip", end.Add(time.Hour))},
		{"another segment", signToken(t, "alice", "default", end.Add(time.Hour))},
		{"expired", signToken(t, "alice", "vip", time.Now().Add(-time.Minute))},
		{"not a token", "a.b.c"},
	}
	for _, r := range refused {
		if m := send(r.tok); m["type"] != "error" || m["code"] != frame.CodeBadToken {
			t.Fatalf("%s: got %v, want a bad_token error", r.name, m)
		}
	}
	later := end.Add(time.Second)
	m := send(signToken(t, "alice", "vip", later))
	if m["type"] != frame.TypeAuthOK || int64(m["expires_ms"].(float64)) != later.Add(-token.Leeway).UnixMilli() {
		t.Fatalf("got %v, want auth_ok with expires_ms %d", m, later.Add(-token.Leeway).UnixMilli())
	}
	// An auth frame is not activity: the session was never renewed.
	if n, _ := tg.rdb.Exists(context.Background(), tg.store.Keyspace().SessionKey("alice")).Result(); n != 0 {
		t.Fatal("an auth frame renewed the session")
	}
	// An older token does not shorten the connection.
	if m := send(signToken(t, "alice", "vip", end)); m["type"] != frame.TypeAuthOK || int64(m["expires_ms"].(float64)) != later.Add(-token.Leeway).UnixMilli() {
		t.Fatalf("an earlier token: got %v, want the later expiry kept", m)
	}
	// Real time must pass: a token runs out by the gateway's own clock,
	// real and in process.
	time.Sleep(time.Until(end.Add(300 * time.Millisecond)))
	pingPong(t, ws) // past the first token's end, still open and renewing
	code, at := readUntilClose(t, ws, 5*time.Second)
	if code != frame.CloseTokenExpired || at.Before(later) || at.After(later.Add(time.Second)) {
		t.Fatalf("close %d %v after the fresh token's end; want %d within 1s after it", code, at.Sub(later), frame.CloseTokenExpired)
	}
}

// TestTokenRules: the issuer, audience and lifetime settings refuse an
// upgrade whose token breaks them.
func TestTokenRules(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.TokenIssuer = "https://login.example"
		c.TokenAudience = "stillthere"
		c.TokenMaxLifetime = time.Hour
	})
	sign := func(c jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(tokenSecret))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	now := time.Now()
	tests := []struct {
		name   string
		claims jwt.MapClaims
		status int
	}{
		{"good", jwt.MapClaims{"sub": "a", "iss": "https://login.example", "aud": "stillthere", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}, http.StatusSwitchingProtocols},
		{"wrong issuer", jwt.MapClaims{"sub": "a", "iss": "https://evil.example", "aud": "stillthere", "exp": now.Add(time.Minute).Unix()}, http.StatusUnauthorized},
		{"no audience", jwt.MapClaims{"sub": "a", "iss": "https://login.example", "exp": now.Add(time.Minute).Unix()}, http.StatusUnauthorized},
		{"longer than an auth frame holds", jwt.MapClaims{"sub": "a", "iss": "https://login.example", "aud": "stillthere", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "pad": strings.Repeat("x", frame.MaxTokenLen)}, http.StatusUnauthorized},
		{"too long", jwt.MapClaims{"sub": "a", "iss": "https://login.example", "aud": "stillthere", "iat": now.Unix(), "exp": now.Add(25 * time.Hour).Unix()}, http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws, resp, err := websocket.DefaultDialer.Dial("ws://"+tg.PublicAddr().String()+"/v1/ws",
				http.Header{"Authorization": {"Bearer " + sign(tt.claims)}})
			if ws != nil {
				ws.Close()
			}
			if resp == nil {
				t.Fatalf("dial: %v", err)
			}
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
		})
	}
}

// TestExpiriesHeap: the token timer's heap gives its connections back in
// the order their tokens end, through additions, removals and tokens
// refreshed while on it, and keeps each connection's place.
func TestExpiriesHeap(t *testing.T) {
	e := newExpiries()
	rng := rand.New(rand.NewPCG(1, 2))
	var conns []*conn
	for range 200 {
		c := &conn{}
		c.expiresSec.Store(uint32(1_000_000 + rng.IntN(10_000)))
		e.add(c)
		conns = append(conns, c)
	}
	for i, c := range conns {
		switch i % 4 {
		case 0:
			e.remove(c)
		case 1:
			e.extend(c, c.expiresSec.Load()+uint32(rng.IntN(5_000)))
		}
	}
	for i, c := range e.heap {
		if int(c.expiryAt) != i+1 {
			t.Fatalf("connection at %d says it is at %d", i, c.expiryAt-1)
		}
	}
	var last uint32
	n := 0
	for len(e.heap) > 0 {
		c := e.heap[0]
		e.removeAt(0)
		if c.expiresSec.Load() < last {
			t.Fatalf("token ending at %d after one ending at %d", c.expiresSec.Load(), last)
		}
		if c.expiryAt != 0 {
			t.Fatal("a connection off the heap keeps a place")
		}
		last = c.expiresSec.Load()
		n++
	}
	if n != 150 {
		t.Fatalf("%d connections came off the heap, want 150", n)
	}
}
