package devstack

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/gateway"
)

// TestRollingRestartSendsNoGuide restarts a gateway under 1,000 active
// clients. They are told 1001, reconnect to another instance at once and
// keep pinging: no session may run out, so no guide may go out.
func TestRollingRestartSendsNoGuide(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 connections")
	}
	const clients = 1000
	s := startStack(t, nil)

	// The instance that restarts, beside the stack's own gateway.
	cfg := s.GatewayConfig
	cfg.Addr, cfg.PushAddr, cfg.InstanceID = "127.0.0.1:0", "127.0.0.1:0", "restarting"
	bctx, stopB := context.WithCancel(context.Background())
	defer stopB()
	b, err := gateway.New(bctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	bDone := make(chan error, 1)
	go func() { bDone <- b.Serve(bctx) }()

	urlB := "ws://" + b.PublicAddr().String() + "/v1/ws"
	urlA := wsURL(s)
	end := time.Now().Add(3*testTTL + 3*time.Second)
	var (
		wg                    sync.WaitGroup
		guides, moved, failed atomic.Int64
	)
	dialer := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	connect := func(url, tok string) *websocket.Conn {
		for attempt := 0; attempt < 5; attempt++ {
			ws, _, err := dialer.Dial(url, http.Header{"Authorization": {"Bearer " + tok}})
			if err == nil {
				return ws
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	}
	// pingOnce pings and reads up to the pong; an error means the
	// connection ended (told 1001, or cut).
	pingOnce := func(ws *websocket.Conn) error {
		ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
			return err
		}
		ws.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			_, msg, err := ws.ReadMessage()
			if err != nil {
				return err
			}
			var f struct{ Type string }
			json.Unmarshal(msg, &f)
			switch f.Type {
			case "guide":
				guides.Add(1)
			case "pong":
				return nil
			}
		}
	}
	ready := make(chan struct{}, clients)
	for i := range clients {
		tok := mint(t, s, "roll-"+strconv.Itoa(i))
		wg.Go(func() {
			ws := connect(urlB, tok)
			if ws == nil || pingOnce(ws) != nil {
				failed.Add(1)
				ready <- struct{}{}
				return
			}
			ready <- struct{}{}
			for time.Now().Before(end) {
				time.Sleep(500 * time.Millisecond)
				if pingOnce(ws) == nil {
					continue
				}
				// Told to go: reconnect to the other instance and renew.
				ws.Close()
				if ws = connect(urlA, tok); ws == nil || pingOnce(ws) != nil {
					failed.Add(1)
					return
				}
				moved.Add(1)
			}
			ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			ws.Close()
		})
	}
	for range clients {
		<-ready
	}
	stopB()
	if err := <-bDone; err != nil {
		t.Errorf("restarting gateway: %v", err)
	}
	wg.Wait()
	// Sessions were ended with 1000; wait past any deadline a lapse would
	// have left, then look at the topic.
	time.Sleep(testTTL + testJitter + time.Second)
	if n := failed.Load(); n != 0 {
		t.Errorf("%d clients could not connect", n)
	}
	if n := moved.Load(); n < clients {
		t.Errorf("only %d of %d clients moved to the other instance", n, clients)
	}
	if n := guides.Load(); n != 0 {
		t.Errorf("%d guides reached active clients", n)
	}
	if evs := topicEvents(t, s); len(evs) != 0 {
		t.Errorf("%d timeout events for clients that never went silent; first %+v", len(evs), evs[0])
	}
}
