package expiry

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
	"github.com/stillthere/stillthere/pkg/token"
)

// Helpers of the attack tests: real gateways in front of the listener,
// and clients that ping them as a chat app would.

// The secrets of gateway.TestConfig, as the attack clients mint tokens.
const (
	attackTokenSecret = gateway.TestTokenSecret
	attackPushSecret  = gateway.TestPushSecret
)

// redisProxy is a TCP proxy in front of the harness's Redis, for a test
// to cut; closed at cleanup.
func (h *harness) redisProxy() *tcpproxy.Proxy {
	h.t.Helper()
	p, err := tcpproxy.Start(h.srv.Addr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { p.Close() })
	return p
}

// attackGateway is a running gateway instance.
type attackGateway struct {
	*gateway.Gateway
}

// startAttackGateway runs a gateway on Redis at addr with the harness's
// key prefix, granting ttl and no jitter, heartbeating every 100ms (as
// gateway.TestConfig does), with room for clients that ping often. It
// stops at cleanup: Close drains it as on SIGTERM. What its Run returns is
// not the attack tests' concern: they cut its Redis on purpose.
func (h *harness) startAttackGateway(addr string, ttl time.Duration, mutate func(*gateway.Config)) *attackGateway {
	t := h.t
	t.Helper()
	cfg := gateway.TestConfig(redisconn.Config{Addrs: []string{addr}, KeyPrefix: h.prefix})
	cfg.SessionTTL, cfg.SessionJitter = ttl, 0
	cfg.RateBurst, cfg.RatePerSecond = 50, 20
	cfg.SendQueue = 64
	if mutate != nil {
		mutate(&cfg)
	}
	g, run := lifecycletest.Start(t, gateway.Open, cfg, h.logger("gateway"))
	run.Tolerate()
	return &attackGateway{Gateway: g}
}

// pinger is one client device: it pings its gateway every period, and
// counts the pongs and errors it is answered.
type pinger struct {
	uid    string
	pongs  atomic.Int64
	errs   atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
	read   chan struct{} // closed when the connection's reader stops (startPinger)
	ws     *websocket.Conn
}

// dialAttack connects uid to g.
func dialAttack(t *testing.T, g *attackGateway, uid string) (*websocket.Conn, error) {
	t.Helper()
	tok, err := token.Mint([]byte(attackTokenSecret), uid, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+g.PublicAddr().String()+"/v1/ws",
		http.Header{"Authorization": {"Bearer " + tok}})
	return ws, err
}

// waitPongs waits until each of ps has been answered at least n pongs in
// all: its pings so far were renewed.
func waitPongs(t *testing.T, n int64, ps ...*pinger) {
	t.Helper()
	waitFor(t, waitLong, fmt.Sprintf("%d pongs for each client", n), func() bool {
		for _, p := range ps {
			if p.pongs.Load() < n {
				return false
			}
		}
		return true
	})
}

// startPinger connects uid to g and pings every period until stop. With
// period 0 it pings once and then stays connected without a word.
func startPinger(t *testing.T, g *attackGateway, uid string, period time.Duration) *pinger {
	t.Helper()
	ws, err := dialAttack(t, g, uid)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &pinger{uid: uid, cancel: cancel, done: make(chan struct{}), read: make(chan struct{}), ws: ws}
	go func() {
		defer close(p.read)
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			if bytes.Contains(b, []byte(`"type":"pong"`)) {
				p.pongs.Add(1)
			} else {
				p.errs.Add(1)
			}
		}
	}()
	var wmu sync.Mutex
	ping := func() {
		wmu.Lock()
		defer wmu.Unlock()
		ws.SetWriteDeadline(time.Now().Add(time.Second))
		ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
	}
	ping()
	go func() {
		defer close(p.done)
		if period == 0 {
			<-ctx.Done()
			return
		}
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				ping()
			}
		}
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *pinger) stop() {
	p.cancel()
	<-p.done
	if p.ws != nil {
		p.ws.Close()
	}
}

// startMovingPinger is startPinger for a client that reconnects when its
// connection is closed, as real clients do: to the next gateway of gws,
// as a load balancer sends it to an instance that is ready.
func startMovingPinger(t *testing.T, gws []*attackGateway, uid string, period time.Duration) *pinger {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &pinger{uid: uid, cancel: cancel, done: make(chan struct{})}
	var mu sync.Mutex // guards ws
	var ws *websocket.Conn
	connect := func(i int) bool {
		for ctx.Err() == nil {
			c, err := dialAttack(t, gws[i%len(gws)], uid)
			if err == nil {
				mu.Lock()
				ws = c
				mu.Unlock()
				return true
			}
			i++
			select { // a client's pause before it dials again
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		return false
	}
	ping := func() {
		mu.Lock()
		defer mu.Unlock()
		if ws != nil {
			ws.SetWriteDeadline(time.Now().Add(time.Second))
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
		}
	}
	if !connect(0) {
		t.Fatal("no gateway to connect to")
	}
	ping()
	readerDone := make(chan struct{})
	go func() { // the reader: reconnects on a close
		defer close(readerDone)
		next := 1
		for ctx.Err() == nil {
			mu.Lock()
			c := ws
			mu.Unlock()
			_, b, err := c.ReadMessage()
			if err == nil && bytes.Contains(b, []byte(`"type":"pong"`)) {
				p.pongs.Add(1)
			}
			if err != nil {
				c.Close()
				if !connect(next) {
					return
				}
				next++
				ping()
			}
		}
	}()
	go func() {
		defer close(p.done)
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				mu.Lock()
				if ws != nil {
					ws.Close()
				}
				mu.Unlock()
				<-readerDone
				return
			case <-tk.C:
				ping()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-p.done })
	return p
}
