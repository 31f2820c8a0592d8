package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// gatewayStub answers every ping with a pong, as the gateway does, and
// counts how its connections ended.
type gatewayStub struct {
	mu     sync.Mutex
	normal int // closed by the client with 1000
	other  int
	wg     sync.WaitGroup
}

func (g *gatewayStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") == "" {
		http.Error(w, "no token", http.StatusUnauthorized)
		return
	}
	ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	g.wg.Add(1)
	defer g.wg.Done()
	defer ws.Close()
	for {
		_, msg, err := ws.ReadMessage()
		if err != nil {
			g.mu.Lock()
			if websocket.IsCloseError(err, websocket.CloseNormalClosure) {
				g.normal++
			} else {
				g.other++
			}
			g.mu.Unlock()
			return
		}
		if bytes.Equal(msg, pingFrame) {
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"pong","ttl_ms":60000}`))
		}
	}
}

func TestRun(t *testing.T) {
	for _, mode := range []string{"epoll", "goroutine"} {
		t.Run(mode, func(t *testing.T) {
			g := &gatewayStub{}
			srv := httptest.NewServer(g)
			defer srv.Close()
			var out bytes.Buffer
			s := settings{
				urls: []string{"ws" + strings.TrimPrefix(srv.URL, "http")}, secret: strings.Repeat("s", 32),
				conns: 20, every: 50 * time.Millisecond, ramp: 1000, hold: 600 * time.Millisecond,
				prefix: "t", pingers: 2, readMode: mode, dials: 5,
			}
			if err := run(context.Background(), s, &out); err != nil {
				t.Fatal(err)
			}
			var line string
			for l := range strings.Lines(out.String()) {
				if strings.HasPrefix(l, "RESULT ") {
					line = strings.TrimSpace(l)
				}
			}
			f := map[string]string{}
			for _, kv := range strings.Fields(line) {
				k, v, _ := strings.Cut(kv, "=")
				f[k] = v
			}
			for k, want := range map[string]string{"conns": "20", "failed": "0", "dropped": "0", "closed": "0"} {
				if f[k] != want {
					t.Errorf("%s=%s, want %s; output:\n%s", k, f[k], want, out.String())
				}
			}
			// 20 connections pinging every 50 ms for 600 ms: about 240
			// pings, each answered and timed unless the leaving cut it
			// short.
			pings, _ := strconv.Atoi(f["pings"])
			timed, _ := strconv.Atoi(f["pong_n"])
			if pings < 20 || timed < pings-20 || f["pong_hist"] == "" {
				t.Errorf("pings=%d pong_n=%d pong_hist=%q: want every ping but the last of each connection timed", pings, timed, f["pong_hist"])
			}
			g.wg.Wait()
			if g.normal != 20 || g.other != 0 {
				t.Errorf("the stub saw %d normal closes and %d other ends, want 20 and 0", g.normal, g.other)
			}
		})
	}
}
