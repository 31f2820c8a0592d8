// Command wsload holds many stillthere client connections against one or
// more gateways and pings on each at a steady interval, for measuring the
// gateways' memory per connection, their renewal batching and push
// routing between instances. It mints its own tokens with the gateways'
// token secret.
//
//	wsload -url ws://127.0.0.1:8080/v1/ws -secret $STILLTHERE_TOKEN_SECRET -conns 10000 -every 15s -hold 60s
//
// Connection i goes to the i-th -url (round robin over a comma-separated
// list) as user <uid-prefix>-<i>, so a caller knows which gateway holds
// which user. A process may open a limited number of files (ulimit -n);
// run several wsload processes for more connections, each with its own
// -uid-prefix. -local-ips spreads connections over source addresses
// (127.0.0.2, ...) past the ports of one address pair.
//
// It prints "ramped ..." once every connection was tried, progress every
// 10 s, and on leaving (the hold ends, or SIGINT/SIGTERM) closes every
// connection normally and prints one line:
//
//	RESULT conns=N failed=N dropped=N closed=N pings=N pongs=N guides=N guide_ids=N
//
// failed: dials that failed; dropped: pings that could not be written;
// closed: connections the gateway ended (before the leaving, which
// -leave-over spreads); guides: guide frames received;
// guide_ids: distinct guide ids among them (guides - guide_ids were
// doubled).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/token"
)

func main() {
	url := flag.String("url", "ws://127.0.0.1:8080/v1/ws", "gateway WebSocket URL, or a comma-separated list (connection i goes to the i-th, round robin)")
	secret := flag.String("secret", os.Getenv("STILLTHERE_TOKEN_SECRET"), "token secret (default $STILLTHERE_TOKEN_SECRET)")
	conns := flag.Int("conns", 1000, "connections to hold")
	every := flag.Duration("every", 15*time.Second, "ping interval per connection")
	rampRate := flag.Int("ramp", 2000, "new connections per second")
	hold := flag.Duration("hold", 60*time.Second, "how long to hold all connections once up (SIGTERM ends it sooner)")
	prefix := flag.String("uid-prefix", "load", "user id prefix")
	localIPs := flag.String("local-ips", "", "comma-separated source addresses to spread connections over")
	leaveOver := flag.Duration("leave-over", 0, "spread the closes at the end over this long (0: all at once)")
	flag.Parse()
	if err := run(*url, *secret, *conns, *every, *rampRate, *hold, *leaveOver, *prefix, *localIPs); err != nil {
		fmt.Fprintln(os.Stderr, "wsload:", err)
		os.Exit(1)
	}
}

type counters struct {
	connected, failed, dropped, closed, pings, pongs, guides atomic.Int64

	mu       sync.Mutex
	guideIDs map[string]struct{}
}

func (c *counters) guide(id string) {
	c.guides.Add(1)
	c.mu.Lock()
	c.guideIDs[id] = struct{}{}
	c.mu.Unlock()
}

func (c *counters) distinctGuides() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.guideIDs)
}

func run(urlList, secret string, n int, every time.Duration, ramp int, hold, leaveOver time.Duration, prefix, localIPs string) error {
	if len(secret) < token.MinSecretLen {
		return fmt.Errorf("-secret: %d bytes, want the gateway's token secret (at least %d)", len(secret), token.MinSecretLen)
	}
	urls := config.SplitList(urlList)
	if len(urls) == 0 {
		return fmt.Errorf("-url: no URL given")
	}
	var ips []net.IP
	for _, s := range config.SplitList(localIPs) {
		ip := net.ParseIP(s)
		if ip == nil {
			return fmt.Errorf("-local-ips: %q is not an IP address", s)
		}
		ips = append(ips, ip)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := &counters{guideIDs: make(map[string]struct{})}
	var wg sync.WaitGroup
	start := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(max(ramp, 1)))
	defer tick.Stop()
	end := time.Time{}
	var endMu sync.Mutex
	getEnd := func() time.Time { endMu.Lock(); defer endMu.Unlock(); return end }
	dialers := make([]*websocket.Dialer, max(len(ips), 1))
	for i := range dialers {
		d := &websocket.Dialer{HandshakeTimeout: 10 * time.Second, ReadBufferSize: 512, WriteBufferSize: 512}
		if len(ips) > 0 {
			nd := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ips[i]}}
			d.NetDialContext = nd.DialContext
		}
		dialers[i] = d
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		select {
		case <-tick.C:
		case <-ctx.Done():
			continue
		}
		uid := prefix + "-" + strconv.Itoa(i)
		tok, err := token.Mint([]byte(secret), uid, "", 24*time.Hour)
		if err != nil {
			return err
		}
		d, url := dialers[i%len(dialers)], urls[i%len(urls)]
		wg.Go(func() { client(ctx, d, url, tok, every, leaveOver, c, getEnd) })
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
			fmt.Printf("open %d, failed %d, dropped %d, closed %d, pings %d, pongs %d, guides %d\n",
				c.connected.Load()-c.dropped.Load()-c.closed.Load(), c.failed.Load(), c.dropped.Load(), c.closed.Load(),
				c.pings.Load(), c.pongs.Load(), c.guides.Load())
		case <-ctx.Done():
		case <-time.After(time.Until(getEnd())):
		}
	}
	stop()
	wg.Wait()
	fmt.Printf("RESULT conns=%d failed=%d dropped=%d closed=%d pings=%d pongs=%d guides=%d guide_ids=%d\n",
		c.connected.Load(), c.failed.Load(), c.dropped.Load(), c.closed.Load(),
		c.pings.Load(), c.pongs.Load(), c.guides.Load(), c.distinctGuides())
	return nil
}

// client holds one connection: a ping every interval (first at a random
// offset, so pings spread evenly), reading pongs and guides, until the
// hold ends; then it leaves with a normal close. It owns the writes; its
// reader goroutine owns the reads and is waited for before it returns.
func client(ctx context.Context, d *websocket.Dialer, url, tok string, every, leaveOver time.Duration, c *counters, end func() time.Time) {
	ws, _, err := d.DialContext(ctx, url, http.Header{"Authorization": {"Bearer " + tok}})
	if err != nil {
		c.failed.Add(1)
		return
	}
	c.connected.Add(1)
	var leaving atomic.Bool // a read error after this is our own close
	readerDone := make(chan struct{})
	defer func() {
		leaving.Store(true)
		ws.Close()
		<-readerDone
	}()
	go func() {
		defer close(readerDone)
		for {
			_, msg, err := ws.ReadMessage()
			if err != nil {
				if !leaving.Load() && ctx.Err() == nil {
					c.closed.Add(1)
				}
				return
			}
			var f struct{ Type, ID string }
			if json.Unmarshal(msg, &f) != nil {
				continue
			}
			switch f.Type {
			case "pong":
				c.pongs.Add(1)
			case "guide":
				c.guide(f.ID)
			}
		}
	}()
	leave := func() {
		if leaveOver > 0 {
			// A burst of 100k normal closes is its own load test; spread
			// them unless asked for one.
			select {
			case <-time.After(rand.N(leaveOver)):
			case <-readerDone:
				return
			}
		}
		leaving.Store(true)
		ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		// Give the gateway a moment to answer the close, so it sees a
		// normal close rather than a reset.
		select {
		case <-readerDone:
		case <-time.After(2 * time.Second):
		}
	}
	wait := time.Duration(rand.Int64N(int64(every)))
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			leave()
			return
		case <-readerDone:
			return
		case <-timer.C:
		}
		timer.Reset(every)
		if e := end(); !e.IsZero() && time.Now().After(e) {
			leave()
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
