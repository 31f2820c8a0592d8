// Command wsload holds many stillthere client connections against a
// gateway and pings on each at a steady interval, for measuring the
// gateway's memory per connection and its renewal batching. It mints its
// own tokens with the gateway's token secret.
//
//	wsload -url ws://127.0.0.1:8080/v1/ws -secret $STILLTHERE_TOKEN_SECRET -conns 10000 -every 15s -hold 60s
//
// A process may open a limited number of files (ulimit -n); run several
// wsload processes for more connections, each with its own -uid-prefix.
// -local-ips spreads connections over source addresses (127.0.0.2, ...)
// past the 64k ports of one address pair.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/token"
)

func main() {
	url := flag.String("url", "ws://127.0.0.1:8080/v1/ws", "gateway WebSocket URL")
	secret := flag.String("secret", os.Getenv("STILLTHERE_TOKEN_SECRET"), "token secret (default $STILLTHERE_TOKEN_SECRET)")
	conns := flag.Int("conns", 1000, "connections to hold")
	every := flag.Duration("every", 15*time.Second, "ping interval per connection")
	rampRate := flag.Int("ramp", 2000, "new connections per second")
	hold := flag.Duration("hold", 60*time.Second, "how long to hold all connections once up")
	prefix := flag.String("uid-prefix", "load", "user id prefix")
	localIPs := flag.String("local-ips", "", "comma-separated source addresses to spread connections over")
	flag.Parse()
	if err := run(*url, *secret, *conns, *every, *rampRate, *hold, *prefix, *localIPs); err != nil {
		fmt.Fprintln(os.Stderr, "wsload:", err)
		os.Exit(1)
	}
}

type counters struct {
	connected, failed, dropped, pings, pongs, guides atomic.Int64
}

func run(url, secret string, n int, every time.Duration, ramp int, hold time.Duration, prefix, localIPs string) error {
	if len(secret) < token.MinSecretLen {
		return fmt.Errorf("-secret: %d bytes, want the gateway's token secret (at least %d)", len(secret), token.MinSecretLen)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var ips []net.IP
	for _, s := range strings.Split(localIPs, ",") {
		if s = strings.TrimSpace(s); s != "" {
			ips = append(ips, net.ParseIP(s))
		}
	}
	var c counters
	var wg sync.WaitGroup
	start := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(max(ramp, 1)))
	defer tick.Stop()
	end := time.Time{}
	var endMu sync.Mutex
	getEnd := func() time.Time { endMu.Lock(); defer endMu.Unlock(); return end }
	for i := 0; i < n && ctx.Err() == nil; i++ {
		<-tick.C
		uid := prefix + "-" + strconv.Itoa(i)
		tok, err := token.Mint([]byte(secret), uid, "", 24*time.Hour)
		if err != nil {
			return err
		}
		d := &websocket.Dialer{HandshakeTimeout: 10 * time.Second, ReadBufferSize: 512, WriteBufferSize: 512}
		if len(ips) > 0 {
			nd := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ips[i%len(ips)]}}
			d.NetDialContext = nd.DialContext
		}
		wg.Go(func() { client(ctx, d, url, tok, every, &c, getEnd) })
	}
	up := time.Since(start)
	endMu.Lock()
	end = time.Now().Add(hold)
	endMu.Unlock()
	fmt.Printf("ramped %d connections in %v (%d failed); holding %v\n", c.connected.Load(), up.Round(time.Millisecond), c.failed.Load(), hold)
	report := time.NewTicker(10 * time.Second)
	defer report.Stop()
	for time.Now().Before(getEnd()) && ctx.Err() == nil {
		select {
		case <-report.C:
			fmt.Printf("open %d, failed %d, dropped %d, pings %d, pongs %d, guides %d\n",
				c.connected.Load()-c.dropped.Load(), c.failed.Load(), c.dropped.Load(), c.pings.Load(), c.pongs.Load(), c.guides.Load())
		case <-ctx.Done():
		case <-time.After(time.Until(getEnd())):
		}
	}
	stop()
	wg.Wait()
	fmt.Printf("RESULT conns=%d failed=%d dropped=%d pings=%d pongs=%d guides=%d\n",
		c.connected.Load(), c.failed.Load(), c.dropped.Load(), c.pings.Load(), c.pongs.Load(), c.guides.Load())
	return nil
}

// client holds one connection: a ping every interval (first at a random
// offset, so pings spread evenly), reading pongs and guides, until the
// hold ends; then it leaves with a normal close.
func client(ctx context.Context, d *websocket.Dialer, url, tok string, every time.Duration, c *counters, end func() time.Time) {
	ws, _, err := d.DialContext(ctx, url, http.Header{"Authorization": {"Bearer " + tok}})
	if err != nil {
		c.failed.Add(1)
		return
	}
	c.connected.Add(1)
	defer ws.Close()
	go func() {
		for {
			_, msg, err := ws.ReadMessage()
			if err != nil {
				return
			}
			s := string(msg)
			switch {
			case strings.Contains(s, `"pong"`):
				c.pongs.Add(1)
			case strings.Contains(s, `"guide"`):
				c.guides.Add(1)
			}
		}
	}()
	wait := time.Duration(rand.Int64N(int64(every)))
	for {
		select {
		case <-ctx.Done():
			ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			return
		case <-time.After(wait):
		}
		wait = every
		if e := end(); !e.IsZero() && time.Now().After(e) {
			ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			return
		}
		ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
			c.dropped.Add(1)
			return
		}
		c.pings.Add(1)
	}
}
