package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/token"
)

// The secrets of TestConfig, as the tests mint tokens and push.
const (
	tokenSecret = TestTokenSecret
	pushSecret  = TestPushSecret
)

type testGateway struct {
	*Gateway
	rdb redis.UniversalClient
	run *lifecycletest.Running
}

func startGateway(t *testing.T, mutate func(*Config)) *testGateway {
	t.Helper()
	return startGatewayOn(t, []string{redistest.Start(t).Addr}, redistest.Prefix(t), mutate)
}

// startGatewayOn starts a gateway on a given Redis and key prefix, so
// several instances can share them.
func startGatewayOn(t *testing.T, addrs []string, prefix string, mutate func(*Config)) *testGateway {
	t.Helper()
	return startGatewayLogged(t, addrs, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), mutate)
}

// startGatewayLogged is startGatewayOn with a logger.
func startGatewayLogged(t *testing.T, addrs []string, prefix string, logger *slog.Logger, mutate func(*Config)) *testGateway {
	t.Helper()
	return startGatewayHooked(t, addrs, prefix, logger, mutate, nil)
}

// startGatewayHooked is startGatewayLogged, with hook called between Open
// and Run. It is the one way this package's tests start a gateway: from
// TestConfig, through lifecycletest, as the other packages' tests do.
func startGatewayHooked(t *testing.T, addrs []string, prefix string, logger *slog.Logger, mutate func(*Config), hook func(*Gateway)) *testGateway {
	t.Helper()
	cfg := TestConfig(redisconn.Config{Addrs: addrs, KeyPrefix: prefix})
	if mutate != nil {
		mutate(&cfg)
	}
	// The test's own client, opened first so that it is closed after the
	// gateway stops.
	rdb, err := redisconn.Open(context.Background(), cfg.Redis)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	var prepare []func(*Gateway)
	if hook != nil {
		prepare = append(prepare, hook)
	}
	g, run := lifecycletest.Start(t, Open, cfg, logger, prepare...)
	return &testGateway{Gateway: g, rdb: rdb, run: run}
}

// stop closes the gateway: Close drains it as on SIGTERM, waits for Run
// and frees it. Later stops return at once.
func (tg *testGateway) stop(t *testing.T) {
	if err := tg.run.Stop(); err != nil {
		t.Error(err)
	}
}

func (tg *testGateway) dial(t *testing.T, uid string) *websocket.Conn {
	t.Helper()
	return tg.dialSegment(t, uid, "")
}

func (tg *testGateway) dialSegment(t *testing.T, uid, segment string) *websocket.Conn {
	t.Helper()
	return tg.dialQuery(t, uid, segment, "")
}

// dialQuery dials uid's connection in segment with query added to the
// URL, and returns once the connection is in the hub: the upgrade's
// answer comes before, and a push right after the dial could find the
// user connected nowhere, or only on the connections they had before.
func (tg *testGateway) dialQuery(t *testing.T, uid, segment, query string) *websocket.Conn {
	t.Helper()
	tok, err := token.Mint([]byte(tokenSecret), uid, segment, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	before := map[*conn]bool{}
	for _, c := range tg.hub.lookup(uid) {
		before[c] = true
	}
	url := "ws://" + tg.PublicAddr().String() + "/v1/ws"
	if query != "" {
		url += "?" + query
	}
	ws, _, err := websocket.DefaultDialer.Dial(url, http.Header{"Authorization": {"Bearer " + tok}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	waitUntil(t, uid+"'s new connection in the hub", func() bool {
		for _, c := range tg.hub.lookup(uid) {
			if !before[c] {
				return true
			}
		}
		return false
	})
	return ws
}

func (tg *testGateway) push(t *testing.T, secret string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, "http://"+tg.PushAddr().String()+"/v1/push", bytes.NewReader(b))
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func readJSON(t *testing.T, ws *websocket.Conn) map[string]any {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, b, err := ws.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func pingPong(t *testing.T, ws *websocket.Conn) float64 {
	t.Helper()
	ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
	m := readJSON(t, ws)
	if m["type"] != "pong" {
		t.Fatalf("got %v, want pong", m)
	}
	return m["ttl_ms"].(float64)
}

func TestPingRenewsWithJitter(t *testing.T) {
	tg := startGateway(t, nil)
	ws := tg.dial(t, "alice")
	key := tg.store.Keyspace().SessionKey("alice")
	if n, _ := tg.rdb.Exists(context.Background(), key).Result(); n != 0 {
		t.Fatal("session exists before the first ping")
	}
	seen := map[float64]bool{}
	var most float64
	for range 5 {
		ttl := pingPong(t, ws)
		if ttl < 10_000 || ttl >= 11_000 {
			t.Fatalf("ttl_ms %v outside [10000, 11000)", ttl)
		}
		seen[ttl] = true
		most = max(most, ttl)
		// A renewal never moves the deadline earlier: the session runs to
		// the latest of the grants, never short of this one.
		pttl, err := tg.rdb.PTTL(context.Background(), key).Result()
		if err != nil || pttl.Milliseconds() > int64(most) || pttl.Milliseconds() < int64(ttl)-1000 {
			t.Fatalf("PTTL %v, granted %vms (at most %vms so far)", pttl, ttl, most)
		}
	}
	if len(seen) < 2 {
		t.Errorf("5 renewals granted the same TTL: no jitter")
	}
}

func TestRenewGranularity(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.RenewGranularity = time.Second })
	ws := tg.dial(t, "fast")
	ctx := context.Background()
	key := tg.store.Keyspace().SessionKey("fast")
	first := pingPong(t, ws)
	// Real time must pass, here and below: the granularity is measured by
	// the gateway's own clock, real and in process, with Redis round trips
	// no synctest bubble can hold.
	time.Sleep(300 * time.Millisecond)
	// Within the granularity: answered from the first grant, not renewed.
	second := pingPong(t, ws)
	if second > first-250 {
		t.Fatalf("second pong ttl_ms %v, want the first grant's remainder (< %v)", second, first-250)
	}
	pttl, _ := tg.rdb.PTTL(ctx, key).Result()
	if pttl.Milliseconds() > int64(first)-250 {
		t.Fatalf("PTTL %v: the key was renewed within the granularity", pttl)
	}
	time.Sleep(800 * time.Millisecond)
	// Past it: renewed again.
	if third := pingPong(t, ws); third < 10_000 {
		t.Fatalf("third pong ttl_ms %v, want a fresh grant", third)
	}
	if pttl, _ := tg.rdb.PTTL(ctx, key).Result(); pttl < 9*time.Second {
		t.Fatalf("PTTL %v after the granularity: not renewed", pttl)
	}
}

func TestConnectionLimit(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.MaxConns = 2 })
	a := tg.dial(t, "a")
	tg.dial(t, "b")
	tok, _ := token.Mint([]byte(tokenSecret), "c", "", time.Hour)
	url := "ws://" + tg.PublicAddr().String() + "/v1/ws"
	_, resp, err := websocket.DefaultDialer.Dial(url, http.Header{"Authorization": {"Bearer " + tok}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("third connection: %v %v, want HTTP 503", resp, err)
	}
	// A freed slot is usable again.
	a.Close()
	var err2 error
	if !waitFor(5*time.Second, func() bool {
		var ws *websocket.Conn
		if ws, _, err2 = websocket.DefaultDialer.Dial(url, http.Header{"Authorization": {"Bearer " + tok}}); err2 != nil {
			return false
		}
		ws.Close()
		return true
	}) {
		t.Fatalf("slot not freed: %v", err2)
	}
}

func TestPolicyChangedAtRuntime(t *testing.T) {
	t.Run("single redis", func(t *testing.T) { testPolicy(t, startGateway(t, nil)) })
	t.Run("redis cluster", func(t *testing.T) {
		testPolicy(t, startGatewayOn(t, redistest.StartCluster(t).Addrs(), redistest.Prefix(t), nil))
	})
}

func testPolicy(t *testing.T, tg *testGateway) {
	vip := tg.dialSegment(t, "v", "vip")
	plain := tg.dialSegment(t, "p", "")
	if ttl := pingPong(t, vip); ttl < 10_000 || ttl >= 11_000 {
		t.Fatalf("before any policy: vip ttl_ms %v, want the configured 10s + jitter", ttl)
	}
	store := policy.NewStore(tg.rdb, tg.store.Keyspace())
	err := store.Save(context.Background(), policy.Policy{
		DefaultTTL: 20 * time.Second,
		Segments:   map[string]time.Duration{"vip": 180 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return pingPong(t, vip) == 180_000 }) {
		t.Fatal("the gateway did not pick up the new policy within 5s")
	}
	if ttl := pingPong(t, plain); ttl != 20_000 {
		t.Fatalf("default segment ttl_ms %v, want the policy's 20000", ttl)
	}
	pttl, _ := tg.rdb.PTTL(context.Background(), tg.store.Keyspace().SessionKey("v")).Result()
	if pttl < 170*time.Second {
		t.Fatalf("vip session PTTL %v, want about 180s", pttl)
	}
}

func TestProtocolPingsDetectDeadClients(t *testing.T) {
	// The gateway pings a quiet connection at most 9/10 of the idle
	// timeout after it last heard from it, so a pong has a tenth of it to
	// come back: 400 ms here, which a client on a busy
	// machine takes (100 ms, with a 1 s timeout, it did not always).
	const idle = 4 * time.Second
	tg := startGateway(t, func(c *Config) { c.IdleTimeout = idle })
	// alive reads, so its client library answers the gateway's pings.
	alive := tg.dial(t, "alive")
	pingPong(t, alive)
	aliveErr := make(chan error, 1)
	go func() {
		// Two idle timeouts: it must outlive at least one ping.
		alive.SetReadDeadline(time.Now().Add(2 * idle))
		_, _, err := alive.ReadMessage()
		aliveErr <- err
	}()
	// mute never reads, so never answers: the gateway must drop it.
	mute := tg.dial(t, "mute")
	pingPong(t, mute)
	before, _ := tg.rdb.PTTL(context.Background(), tg.store.Keyspace().SessionKey("alive")).Result()

	if !waitFor(3*idle, func() bool { return len(tg.hub.lookup("mute")) == 0 }) {
		t.Fatal("a client that answers no pings was not dropped")
	}
	var ne net.Error
	if err := <-aliveErr; !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("the answering client ended with %v; want it still open at its own deadline", err)
	}
	if len(tg.hub.lookup("alive")) != 1 {
		t.Fatal("the answering client was dropped")
	}
	// Protocol pongs are not activity: the session was not renewed.
	after, _ := tg.rdb.PTTL(context.Background(), tg.store.Keyspace().SessionKey("alive")).Result()
	if after >= before {
		t.Fatalf("PTTL went from %v to %v on protocol pongs alone", before, after)
	}
}

func TestPushEndpoint(t *testing.T) {
	tg := startGateway(t, nil)
	phone := tg.dial(t, "bob")
	laptop := tg.dial(t, "bob")
	pingPong(t, phone)
	pingPong(t, laptop)
	guide := map[string]string{"id": "g1", "uid": "bob", "text": "Are you still there?"}

	t.Run("unauthenticated", func(t *testing.T) {
		for _, secret := range []string{"", "wrong-secret-wrong-secret-wrong-secret"} {
			if code, _ := tg.push(t, secret, guide); code != http.StatusUnauthorized {
				t.Errorf("secret %q: status %d, want 401", secret, code)
			}
		}
	})
	t.Run("bad request", func(t *testing.T) {
		for _, body := range []any{
			map[string]string{"uid": "bob", "text": "x"},
			map[string]string{"id": "g", "uid": "b b", "text": "x"},
			map[string]string{"id": "g", "uid": "bob"},
			map[string]any{"id": "g", "uid": "bob", "text": "x", "deadline_ms": "soon"},
			map[string]string{"id": "g", "uid": "bob", "text": "x", "segment": "no spaces"},
			"not an object",
		} {
			if code, out := tg.push(t, pushSecret, body); code != http.StatusBadRequest || out["error"] == nil {
				t.Errorf("%v: status %d %v, want 400 with an error", body, code, out)
			}
		}
	})
	t.Run("delivered to every connection, once", func(t *testing.T) {
		code, out := tg.push(t, pushSecret, guide)
		if code != 200 || out["status"] != "delivered" || out["connections"] != 2.0 {
			t.Fatalf("push: %d %v", code, out)
		}
		for _, ws := range []*websocket.Conn{phone, laptop} {
			if m := readJSON(t, ws); m["type"] != "guide" || m["id"] != "g1" || m["text"] != "Are you still there?" {
				t.Fatalf("got %v", m)
			}
		}
		code, out = tg.push(t, pushSecret, guide)
		if code != 200 || out["status"] != "duplicate" {
			t.Fatalf("second push: %d %v, want duplicate", code, out)
		}
		// Nothing more arrives: the next frame is the pong.
		if pingPong(t, phone) == 0 {
			t.Fatal("no pong")
		}
	})
	t.Run("offline user gets it on the next connect, once", func(t *testing.T) {
		g := map[string]string{"id": "g2", "uid": "nobody", "text": "Are you still there?"}
		code, out := tg.push(t, pushSecret, g)
		if code != 200 || out["status"] != "queued" {
			t.Fatalf("push: %d %v, want 200 queued", code, out)
		}
		if code, out := tg.push(t, pushSecret, g); code != 200 || out["status"] != "duplicate" {
			t.Fatalf("second push of a queued guide: %d %v, want duplicate", code, out)
		}
		ws := tg.dial(t, "nobody")
		if m := readJSON(t, ws); m["type"] != "guide" || m["id"] != "g2" {
			t.Fatalf("on connect: %v, want the kept guide", m)
		}
		again := tg.dial(t, "nobody")
		if ttl := pingPong(t, again); ttl == 0 { // the first frame is the pong: the inbox is empty
			t.Fatal("no pong")
		}
	})
	t.Run("inbox is capped", func(t *testing.T) {
		for i := range 5 {
			tg.push(t, pushSecret, map[string]string{"id": "c" + strconv.Itoa(i), "uid": "capped", "text": "t"})
		}
		ws := tg.dial(t, "capped")
		for _, want := range []string{"c2", "c3", "c4"} { // the newest 3, oldest first
			if m := readJSON(t, ws); m["id"] != want {
				t.Fatalf("got %v, want guide %s", m, want)
			}
		}
		if pingPong(t, ws) == 0 {
			t.Fatal("no pong")
		}
	})
	t.Run("health", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			resp, err := http.Get("http://" + tg.PushAddr().String() + path)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("%s: %v %v", path, resp, err)
			}
			resp.Body.Close()
		}
		// The public listener serves only the WebSocket.
		resp, err := http.Get("http://" + tg.PublicAddr().String() + "/metrics")
		if err != nil || resp.StatusCode != 404 {
			t.Fatalf("public /metrics: %v %v, want 404", resp, err)
		}
		resp.Body.Close()
	})
}

func TestPushRoutesAcrossInstances(t *testing.T) {
	t.Run("single redis", func(t *testing.T) {
		testRouting(t, []string{redistest.Start(t).Addr})
	})
	t.Run("redis cluster", func(t *testing.T) {
		testRouting(t, redistest.StartCluster(t).Addrs())
	})
}

func testRouting(t *testing.T, addrs []string) {
	prefix := redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ws := a.dial(t, "roamer")
	pingPong(t, ws)

	// The consumer reached instance b; the user is on a.
	code, out := b.push(t, pushSecret, map[string]string{"id": "r1", "uid": "roamer", "text": "Are you still there?"})
	if code != 200 || out["status"] != "delivered" || out["connections"] != 1.0 {
		t.Fatalf("push via the other instance: %d %v", code, out)
	}
	if m := readJSON(t, ws); m["type"] != "guide" || m["id"] != "r1" {
		t.Fatalf("got %v, want the routed guide", m)
	}
	pingPong(t, ws) // reading on answers a's ping after r1: proof
	waitUntil(t, "r1, proven, leaves the inbox it was kept in ahead", func() bool {
		return b.rdb.LLen(context.Background(), b.store.Keyspace().InboxKey("roamer")).Val() == 0
	})
	if code, out := a.push(t, pushSecret, map[string]string{"id": "r1", "uid": "roamer", "text": "x"}); out["status"] != "duplicate" {
		t.Fatalf("same id via a: %d %v, want duplicate across instances", code, out)
	}

	// a stops: its route entry goes with its connections, and a guide
	// via b is kept for the user's next connect.
	go func() { // the client reads on, and so answers a's close
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
		}
	}()
	a.stop(t)
	code, out = b.push(t, pushSecret, map[string]string{"id": "r2", "uid": "roamer", "text": "t"})
	if code != 200 || out["status"] != "queued" {
		t.Fatalf("push after a stopped: %d %v, want queued", code, out)
	}
	ws2 := b.dial(t, "roamer")
	if m := readJSON(t, ws2); m["id"] != "r2" {
		t.Fatalf("on reconnect to b: %v, want r2", m)
	}
}

func TestStaleRouteIsDropped(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	key := tg.store.Keyspace().RouteKey("ghost")
	// An instance that crashed without unregistering: its lease ran out.
	if _, err := tg.store.Heartbeat(ctx, "crashed-instance", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	tg.rdb.HSet(ctx, key, "crashed-instance", 1)
	waitUntil(t, "the gateway sees the instance dead", func() bool { return tg.instanceDead("crashed-instance") })
	code, out := tg.push(t, pushSecret, map[string]string{"id": "s1", "uid": "ghost", "text": "t"})
	if code != 200 || out["status"] != "queued" {
		t.Fatalf("push: %d %v, want queued", code, out)
	}
	if n, _ := tg.rdb.HLen(ctx, key).Result(); n != 0 {
		t.Fatalf("stale route entry kept: %d entries", n)
	}
}

func TestCloseEndsOrKeepsSession(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	exists := func(uid string) bool {
		n, _ := tg.rdb.Exists(ctx, tg.store.Keyspace().SessionKey(uid)).Result()
		return n == 1
	}
	// A close ends the session, or not, in the route write that takes the
	// connection out of the user's route: the session is judged once that
	// write has landed, not when the connection leaves the hub.
	inRoute := func(uid string) bool {
		return tg.rdb.HExists(ctx, tg.store.Keyspace().RouteKey(uid), tg.instance).Val()
	}

	normal := tg.dial(t, "normal")
	pingPong(t, normal)
	normal.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	waitUntil(t, "normal close deletes the session", func() bool { return !exists("normal") })

	for _, code := range []int{websocket.CloseGoingAway, 4000} {
		uid := "code" + strconv.Itoa(code)
		ws := tg.dial(t, uid)
		pingPong(t, ws)
		waitUntil(t, "the connection in its route", func() bool { return inRoute(uid) })
		ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, ""), time.Now().Add(time.Second))
		waitUntil(t, "server ends the connection", func() bool { return len(tg.hub.lookup(uid)) == 0 })
		waitUntil(t, "the connection out of its route", func() bool { return !inRoute(uid) })
		if !exists(uid) {
			t.Errorf("close %d deleted the session", code)
		}
	}

	dropped := tg.dial(t, "dropped")
	pingPong(t, dropped)
	waitUntil(t, "the connection in its route", func() bool { return inRoute("dropped") })
	dropped.NetConn().Close()
	waitUntil(t, "server notices the drop", func() bool { return len(tg.hub.lookup("dropped")) == 0 })
	waitUntil(t, "the dropped connection out of its route", func() bool { return !inRoute("dropped") })
	if !exists("dropped") {
		t.Error("a dropped connection deleted the session")
	}
}

func TestShutdownSends1001AndKeepsSessions(t *testing.T) {
	tg := startGateway(t, nil)
	var conns []*websocket.Conn
	for _, uid := range []string{"a", "b", "c"} {
		ws := tg.dial(t, uid)
		pingPong(t, ws)
		conns = append(conns, ws)
	}
	// Clients read all along, as real ones do, and so answer the close.
	ended := make(chan error, len(conns))
	for _, ws := range conns {
		go func() {
			ws.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, _, err := ws.ReadMessage()
			ended <- err
		}()
	}
	tg.stop(t)
	for range conns {
		if err := <-ended; !websocket.IsCloseError(err, websocket.CloseGoingAway) {
			t.Errorf("connection ended with %v, want 1001", err)
		}
	}
	for _, uid := range []string{"a", "b", "c"} {
		if n, _ := tg.rdb.Exists(context.Background(), tg.store.Keyspace().SessionKey(uid)).Result(); n != 1 {
			t.Errorf("session %s gone after shutdown", uid)
		}
	}
}

func TestOriginPolicy(t *testing.T) {
	tests := []struct {
		allowed []string
		origin  string
		host    string
		want    bool
	}{
		{nil, "", "chat.example", true},
		{nil, "https://chat.example", "chat.example", true},
		{nil, "https://CHAT.example", "chat.example", true},
		{nil, "https://evil.example", "chat.example", false},
		{nil, "null", "chat.example", false},
		{[]string{"https://app.example"}, "https://app.example", "gw.example", true},
		{[]string{"https://app.example"}, "https://chat.example", "chat.example", false},
		{[]string{"https://app.example"}, "", "gw.example", true},
	}
	for _, tt := range tests {
		g := &Gateway{cfg: Config{AllowedOrigins: tt.allowed}}
		r, _ := http.NewRequest("GET", "http://"+tt.host+"/v1/ws", nil)
		if tt.origin != "" {
			r.Header.Set("Origin", tt.origin)
		}
		if got := g.originAllowed(r); got != tt.want {
			t.Errorf("allowed %v, Origin %q, Host %q: got %v, want %v", tt.allowed, tt.origin, tt.host, got, tt.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good, err := LoadConfig(nil, func(k string) (string, bool) {
		return map[string]string{"STILLTHERE_TOKEN_SECRET": tokenSecret, "STILLTHERE_PUSH_SECRET": pushSecret}[k], true
	})
	if err != nil {
		t.Fatalf("defaults with secrets: %v", err)
	}
	tests := []struct {
		field  string
		mutate func(*Config)
	}{
		{"token-secret", func(c *Config) { c.TokenSecret = "short" }},
		{"push-secret", func(c *Config) { c.PushSecret = "" }},
		{"session-ttl", func(c *Config) { c.SessionTTL = 0 }},
		{"session-jitter", func(c *Config) { c.SessionJitter = -1 }},
		{"read-limit", func(c *Config) { c.ReadLimit = 1 }},
		{"rate-per-second", func(c *Config) { c.RatePerSecond = 0 }},
		{"guide-max-age", func(c *Config) { c.GuideMaxAge = -time.Second }},
		{"guide-max-age", func(c *Config) { c.GuideMaxAge = time.Millisecond }},
		{"max-user-conns: -1, want at least 1 (0 for the default, 10)", func(c *Config) { c.MaxUserConns = -1 }},
		{"renew-granularity", func(c *Config) { c.RenewGranularity = -1 }},
		{"renew-granularity: 31s, want between 0 and half the session-ttl 1m0s (30s)", func(c *Config) { c.RenewGranularity = 31 * time.Second }},
		{"heartbeat-interval", func(c *Config) { c.HeartbeatInterval = 50 * time.Millisecond }},
		{"heartbeat-interval", func(c *Config) { c.HeartbeatInterval = 11 * time.Second }},
		{"redis-addrs", func(c *Config) { c.Redis.Addrs = nil }},
		{"key-prefix", func(c *Config) { c.Redis.KeyPrefix = "a{b}" }},
	}
	for _, tt := range tests {
		c := good
		tt.mutate(&c)
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), tt.field) {
			t.Errorf("%s: Validate = %v, want an error naming it", tt.field, err)
		}
	}
}

// TestDrainTurnedAwayConnectionLetsGoOfItsInbox: a connection still being
// set up when the drain begins is turned away (1001) after it took its
// user's inbox. It ends as a served connection does: its done closes, so
// that a handover waiting on its proofs (another connection's release may
// have offered it the inbox, from a goroutine the drain waits for) ends
// and the drain with it; and the guides it leased are let go at once, so
// that the reconnect elsewhere gets them then, not once the lease lapses
// (its own time per chunk, and 5 s). Seen as a test gateway that took
// over 20 s to stop on a busy machine, waiting for such a handover.
func TestDrainTurnedAwayConnectionLetsGoOfItsInbox(t *testing.T) {
	tg := startGateway(t, nil)
	other := startGatewayOn(t, []string{tg.cfg.Redis.Addrs[0]}, tg.cfg.Redis.KeyPrefix, nil)
	ks := tg.store.Keyspace()
	ctx := context.Background()
	req := stagePush("mara", redisNowMS(t, tg.rdb), 1, timeoutevent.ActionRemind)
	tg.mustPush(t, req, push.Queued) // connected nowhere: kept in the inbox

	// The drain begins while mara's connection is being set up.
	tg.testSetup = func() {
		tg.connsMu.Lock()
		tg.draining = true
		tg.connsMu.Unlock()
	}
	tok, err := token.Mint([]byte(tokenSecret), "mara", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+tg.PublicAddr().String()+"/v1/ws", http.Header{"Authorization": {"Bearer " + tok}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	for {
		ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, _, err := ws.ReadMessage(); err != nil {
			if !websocket.IsCloseError(err, websocket.CloseGoingAway) {
				t.Fatalf("turned-away connection ended with %v, want 1001", err)
			}
			break
		}
	}
	waitUntil(t, "the turned-away connection's lease let go", func() bool {
		return tg.rdb.HLen(ctx, ks.InboxLeaseKey("mara")).Val() == 0
	})

	// The client reconnects at once, to another instance: the guide is
	// there for it.
	back := other.dial(t, "mara")
	readStage(t, back, req)
}

// TestRunWaitsForConnectionBeingSetUp: a connection still being set up
// when the drain begins is turned away by its handler, which then writes
// its route and hands on its guides. An HTTP server's Shutdown does not
// wait for the handler of an upgraded connection, so Run, and Close after
// it, must: a gateway that returned before would leave that bookkeeping
// to a goroutine racing the closing of its Redis clients.
func TestRunWaitsForConnectionBeingSetUp(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	inSetup, release := make(chan struct{}), make(chan struct{})
	tg.testSetup = func() {
		close(inSetup)
		<-release
	}
	tok, err := token.Mint([]byte(tokenSecret), "nell", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dialed := make(chan *websocket.Conn, 1)
	go func() {
		ws, _, err := websocket.DefaultDialer.Dial("ws://"+tg.PublicAddr().String()+"/v1/ws", http.Header{"Authorization": {"Bearer " + tok}})
		if err != nil {
			t.Errorf("dial: %v", err)
			close(dialed)
			return
		}
		dialed <- ws
	}()
	<-inSetup
	stopped := make(chan struct{})
	go func() {
		tg.stop(t)
		close(stopped)
	}()
	waitUntil(t, "the drain to begin", func() bool {
		tg.connsMu.Lock()
		defer tg.connsMu.Unlock()
		return tg.draining
	})
	select {
	case <-stopped:
		t.Fatal("the gateway stopped while a connection was being set up")
	case <-time.After(300 * time.Millisecond): // long enough for a drain with no connections to end
	}
	close(release)
	<-stopped
	// The turned-away connection's bookkeeping was done before the stop
	// returned: it is out of its route.
	if tg.rdb.HExists(ctx, tg.store.Keyspace().RouteKey("nell"), tg.instance).Val() {
		t.Error("the turned-away connection is still in its route after the gateway stopped")
	}
	if ws, ok := <-dialed; ok {
		ws.Close()
	}
}

// TestRouteLostWithDataWrittenAgainAtPing: a Redis node that restarts
// without its data loses the user's route with their session, and
// neither instance's heartbeat or channel need be on that node: nothing
// else tells the instance holding the user. A push through another
// instance would find them connected nowhere and keep the guide for a
// connect that does not come (until the minute's refresh). The user's
// next ping, which finds Redis knowing nothing of them, writes the route
// again.
func TestRouteLostWithDataWrittenAgainAtPing(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	uid := "lost-route"
	ws := a.dial(t, uid)
	pingPong(t, ws)
	ks := a.store.Keyspace()
	// The user's keys go, as on a node restarted empty.
	ctx := context.Background()
	if err := a.rdb.Del(ctx, ks.RouteKey(uid), ks.RenewedKey(uid), ks.SessionKey(uid)).Err(); err != nil {
		t.Fatal(err)
	}
	pingPong(t, ws)
	waitUntil(t, "the user's route written again", func() bool { return a.rdb.Exists(ctx, ks.RouteKey(uid)).Val() == 1 })
	code, out := b.push(t, pushSecret, map[string]string{"id": "lr1", "uid": uid, "text": "Are you still there?"})
	if code != 200 || out["status"] != "delivered" || out["connections"] != 1.0 {
		t.Fatalf("push via the other instance: %d %v, want delivered to the user's one connection", code, out)
	}
	if m := readJSON(t, ws); m["type"] != "guide" || m["id"] != "lr1" {
		t.Fatalf("got %v, want the routed guide", m)
	}
}
