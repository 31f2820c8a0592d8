package devstack

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestRollingRestartSendsNoGuide restarts a gateway under 1,000 active
// clients. They are told 1001, reconnect to another instance at once and
// keep pinging: no session may run out, so no guide may go out. The
// whole instance reconnects to the other at once, and on a busy machine
// its reconnects and first pings take longer than what their grants have
// left: the drain they were told to leave by is a silence we caused.
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
	var (
		wg                    sync.WaitGroup
		guides, moved, failed atomic.Int64
	)
	// The clients stop pinging, and leave with a normal close, once stop
	// is closed.
	stop := make(chan struct{})
	dialer := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	// connect dials as the real client does: at once, then again after
	// an exponential backoff with full jitter, until it gets through or
	// the test has waited long enough to call it a failure.
	connect := func(url, tok string) *websocket.Conn {
		giveUp := time.Now().Add(30 * time.Second)
		for step := 0; ; step++ {
			ws, _, err := dialer.Dial(url, http.Header{"Authorization": {"Bearer " + tok}})
			if err == nil {
				return ws
			}
			if time.Now().After(giveUp) {
				return nil
			}
			time.Sleep(rand.N(min(5*time.Second, 500*time.Millisecond<<step)))
		}
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
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
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
			hasMoved := false
			for !stopped() {
				time.Sleep(500 * time.Millisecond)
				if pingOnce(ws) == nil {
					continue
				}
				// Told to go, or cut: reconnect to the other instance and
				// renew there.
				ws.Close()
				if ws = connect(urlA, tok); ws == nil || pingOnce(ws) != nil {
					failed.Add(1)
					return
				}
				if !hasMoved {
					hasMoved = true
					moved.Add(1)
				}
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
	waitCond(t, 60*time.Second, "every client to move to the other instance", func() bool {
		return moved.Load()+failed.Load() == clients
	})
	// Real time must pass: the clients keep pinging on the other instance
	// for one grace, so that every timeout the drain held is released and
	// checked again while its user is still there.
	time.Sleep(s.ListenerConfig.OutageGrace)
	close(stop)
	wg.Wait()
	// Sessions were ended with 1000: once none is left in the index or
	// held, and the listener has swept twice since, nothing that lapsed
	// is still on its way to the topic.
	waitQuiet(t, s)
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

// waitCond waits until cond holds, for at most within.
func waitCond(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitQuiet waits until the stack's deadline index and hold sets are
// empty, every session ended or settled, and then until the listener has
// completed two sweeps since: a timeout a sweep read before has been
// produced by then, or never will be.
func waitQuiet(t *testing.T, s *Stack) {
	t.Helper()
	ctx := context.Background()
	rdb, err := redisconn.Open(ctx, s.GatewayConfig.Redis)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ks := s.GatewayConfig.Redis.Keyspace()
	waitCond(t, 30*time.Second, "the deadline index and hold sets to empty", func() bool {
		for b := range session.Buckets {
			n, err := rdb.ZCard(ctx, ks.IndexKey(b)).Result()
			if err != nil || n != 0 {
				return false
			}
			if n, err = rdb.ZCard(ctx, ks.HoldKey(b)).Result(); err != nil || n != 0 {
				return false
			}
		}
		return true
	})
	from := listenerSweeps(t, s)
	waitCond(t, 30*time.Second, "two more sweeps of the listener", func() bool { return listenerSweeps(t, s) >= from+2 })
}

// listenerSweeps is how many sweeps the stack's listener has completed,
// from its metrics.
func listenerSweeps(t *testing.T, s *Stack) int64 {
	t.Helper()
	resp, err := http.Get("http://" + s.Listener.AdminAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "stillthere_listener_sweep_seconds_count "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("sweep count %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatal("the listener's metrics have no sweep count")
	return 0
}
