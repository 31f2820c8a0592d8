// Command wsload holds many stillthere client connections against one or
// more gateways and pings on each at a steady interval, for measuring the
// gateways' memory per connection, their renewal batching, push routing
// between instances and the ping→pong time. It mints its own tokens with
// the gateways' token secret.
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
// An idle connection has no goroutine of its own: a few pinger goroutines
// (-pingers) send every ping, each from a queue of its connections by due
// time, and the reads are package wsread's, as the gateway's are: in
// epoll mode a few workers read the connections that have something to
// read (-read-mode).
//
// It prints "ramping conns=N failed=N" (connected, failed so far) every
// 5 s while it dials, "ramped ..." once every connection was tried,
// progress every 10 s, "pinging" when the pings start after -idle, and
// on leaving (the hold ends, or SIGINT/SIGTERM) closes every connection
// normally and prints one line:
//
//	RESULT conns=N failed=N dropped=N closed=N pings=N pongs=N guides=N guide_ids=N pong_n=N pong_p50_ms=F pong_p99_ms=F pong_p999_ms=F pong_max_ms=F pong_hist=H
//
// failed: dials that failed; dropped: pings that could not be written;
// closed: connections the gateway ended (before the leaving, which
// -leave-over spreads); guides: guide frames received; guide_ids:
// distinct guide ids among them (guides - guide_ids were doubled).
// pong_*: the time from writing a ping to reading its pong, over the
// pings answered since the start or the last SIGUSR1 (pong_n of them);
// pong_hist is their histogram in the text form of package latency, for
// merging with other processes'. SIGUSR1 starts these figures afresh and
// prints those of the period it ends, as "mark pong_n=N ... pong_hist=H":
// two marks bound a window.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/loadtest/latency"
	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/token"
	"github.com/stillthere/stillthere/pkg/wsread"
)

type settings struct {
	urls      []string
	secret    string
	conns     int
	every     time.Duration
	ramp      int
	hold      time.Duration
	idle      time.Duration
	leaveOver time.Duration
	prefix    string
	ips       []net.IP
	pingers   int
	readMode  string
	dials     int
}

// readLimit bounds a gateway frame: a guide with its text fits many
// times over. wsread sizes its batch buffers from it.
const readLimit = 16 << 10

func main() {
	var s settings
	url := flag.String("url", "ws://127.0.0.1:8080/v1/ws", "gateway WebSocket URL, or a comma-separated list (connection i goes to the i-th, round robin)")
	flag.StringVar(&s.secret, "secret", os.Getenv("STILLTHERE_TOKEN_SECRET"), "token secret (default $STILLTHERE_TOKEN_SECRET)")
	flag.IntVar(&s.conns, "conns", 1000, "connections to hold")
	flag.DurationVar(&s.every, "every", 15*time.Second, "ping interval per connection")
	flag.IntVar(&s.ramp, "ramp", 2000, "new connections per second")
	flag.DurationVar(&s.hold, "hold", 60*time.Second, "how long to hold all connections once up (SIGTERM ends it sooner)")
	flag.DurationVar(&s.idle, "idle", 0, "once up, hold without pinging for this long (part of -hold), then ping; 0: each connection pings from its start")
	flag.StringVar(&s.prefix, "uid-prefix", "load", "user id prefix")
	localIPs := flag.String("local-ips", "", "comma-separated source addresses to spread connections over")
	flag.DurationVar(&s.leaveOver, "leave-over", 0, "spread the closes at the end over this long (0: all at once)")
	flag.IntVar(&s.dials, "dials", 200, "most dials under way at once: a gateway slower than -ramp slows the ramp instead of timing dials out")
	flag.IntVar(&s.pingers, "pingers", 2, "goroutines sending the pings, each for a share of the connections")
	flag.StringVar(&s.readMode, "read-mode", string(wsread.DefaultMode()), "how connections are read: epoll (a few workers for all, Linux) or goroutine (one parked per connection)")
	flag.Parse()
	s.urls = config.SplitList(*url)
	for _, a := range config.SplitList(*localIPs) {
		ip := net.ParseIP(a)
		if ip == nil {
			fmt.Fprintf(os.Stderr, "wsload: -local-ips: %q is not an IP address\n", a)
			os.Exit(2)
		}
		s.ips = append(s.ips, ip)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, s, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "wsload:", err)
		os.Exit(1)
	}
}

func (s settings) validate() error {
	switch {
	case len(s.secret) < token.MinSecretLen:
		return fmt.Errorf("-secret: %d bytes, want the gateway's token secret (at least %d)", len(s.secret), token.MinSecretLen)
	case len(s.urls) == 0:
		return fmt.Errorf("-url: no URL given")
	case s.every <= 0:
		return fmt.Errorf("-every: %v, want more than 0", s.every)
	case s.pingers < 1:
		return fmt.Errorf("-pingers: %d, want at least 1", s.pingers)
	case s.dials < 1:
		return fmt.Errorf("-dials: %d, want at least 1", s.dials)
	}
	if _, err := wsread.ParseMode(s.readMode); err != nil {
		return fmt.Errorf("-read-mode: %w", err)
	}
	return nil
}

// never is the due time of a connection that is not to ping yet (-idle).
var never = time.Now().AddDate(100, 0, 0)

// run holds the connections until the hold ends or ctx does, then leaves
// and prints the RESULT line. It returns once every goroutine it started
// has ended.
func run(ctx context.Context, s settings, out io.Writer) error {
	if err := s.validate(); err != nil {
		return err
	}
	mode, _ := wsread.ParseMode(s.readMode)
	srv, err := wsread.New(wsread.Config{Mode: mode, ReadLimit: readLimit})
	if err != nil {
		return err
	}
	// The reads outlive ctx: the leaving reads the gateways' closes.
	var rwg sync.WaitGroup
	rwg.Go(func() { srv.Run(context.Background()) })
	defer func() { srv.Close(); rwg.Wait() }()
	l := newLoad(s.every)
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)

	// The pingers outlive ctx: they send the closes of the leaving.
	pctx, stopPingers := context.WithCancel(context.Background())
	var pwg sync.WaitGroup
	defer func() { stopPingers(); pwg.Wait() }()
	pingers := make([]*pinger, s.pingers)
	for i := range pingers {
		pingers[i] = newPinger()
		p := pingers[i]
		pwg.Go(func() { p.run(pctx, (*conn).fire) })
	}

	dialers := make([]*websocket.Dialer, max(len(s.ips), 1))
	for i := range dialers {
		// Buffers as the gateway has them: a read buffer that only ever
		// holds part of a batch (epoll), and write buffers pooled, so an
		// idle connection holds none.
		d := &websocket.Dialer{HandshakeTimeout: 10 * time.Second, ReadBufferSize: 512, WriteBufferSize: 512, WriteBufferPool: &sync.Pool{}}
		if mode == wsread.ModeEpoll {
			d.ReadBufferSize = 128
		}
		if len(s.ips) > 0 {
			nd := &net.Dialer{LocalAddr: &net.TCPAddr{IP: s.ips[i]}}
			d.NetDialContext = nd.DialContext
		}
		dialers[i] = d
	}
	var mu sync.Mutex
	var all []*conn // for the last close, of those the leaving did not end
	start := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(max(s.ramp, 1)))
	// Progress while dialing, so that a caller can tell a slow ramp from
	// a stalled one.
	rampDone := make(chan struct{})
	var progress sync.WaitGroup
	progress.Go(func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				fmt.Fprintf(out, "ramping conns=%d failed=%d\n", l.connected.Load(), l.failed.Load())
			case <-rampDone:
				return
			}
		}
	})
	var dials sync.WaitGroup
	slots := make(chan struct{}, s.dials)
	for i := 0; i < s.conns && ctx.Err() == nil; i++ {
		select {
		case <-tick.C:
		case <-ctx.Done():
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		uid := s.prefix + "-" + strconv.Itoa(i)
		tok, err := token.Mint([]byte(s.secret), uid, "", 24*time.Hour)
		if err != nil {
			tick.Stop()
			dials.Wait()
			close(rampDone)
			progress.Wait()
			return err
		}
		d, url, p := dialers[i%len(dialers)], s.urls[i%len(s.urls)], pingers[i%len(pingers)]
		dials.Go(func() {
			defer func() { <-slots }()
			wc, _, err := srv.Dial(ctx, d, url, http.Header{"Authorization": {"Bearer " + tok}})
			if err != nil {
				l.failed.Add(1)
				return
			}
			c := &conn{l: l, ws: wc.WS()}
			mu.Lock()
			all = append(all, c)
			mu.Unlock()
			l.live.Add(1)
			l.connected.Add(1)
			srv.Serve(wc, c)
			due := never
			if s.idle == 0 {
				// The first ping at a random offset, so pings spread evenly.
				due = time.Now().Add(rand.N(s.every))
			}
			p.add(c, due)
		})
	}
	tick.Stop()
	dials.Wait()
	close(rampDone)
	progress.Wait()
	fmt.Fprintf(out, "ramped %d connections in %v (%d failed); holding %v\n", l.connected.Load(), time.Since(start).Round(time.Millisecond), l.failed.Load(), s.hold)

	end := time.NewTimer(s.hold)
	defer end.Stop()
	var idleEnd <-chan time.Time
	if s.idle > 0 {
		t := time.NewTimer(s.idle)
		defer t.Stop()
		idleEnd = t.C
	}
	report := time.NewTicker(10 * time.Second)
	defer report.Stop()
hold:
	for {
		select {
		case <-report.C:
			fmt.Fprintf(out, "open %d, failed %d, dropped %d, closed %d, pings %d, pongs %d, guides %d\n",
				l.connected.Load()-l.dropped.Load()-l.closed.Load(), l.failed.Load(), l.dropped.Load(), l.closed.Load(),
				l.pings.Load(), l.pongs.Load(), l.guides.Load())
		case <-idleEnd:
			now := time.Now()
			for _, p := range pingers {
				p.retime(func(*conn) time.Time { return now.Add(rand.N(s.every)) })
			}
			fmt.Fprintln(out, "pinging")
		case <-usr1:
			fmt.Fprintln(out, "mark "+pongFields(l.mark()))
		case <-end.C:
			break hold
		case <-ctx.Done():
			break hold
		}
	}

	// The leaving: each connection's next firing is its close, spread
	// over -leave-over; the gateway answers each, and the reads end.
	l.leaving.Store(true)
	now := time.Now()
	for _, p := range pingers {
		p.retime(func(*conn) time.Time {
			if s.leaveOver <= 0 {
				return now
			}
			return now.Add(rand.N(s.leaveOver))
		})
	}
	// Give the gateway a moment past the last close to answer it, so it
	// sees normal closes rather than resets; then close what is left.
	if !waitFor(&l.live, s.leaveOver+3*time.Second) {
		mu.Lock()
		for _, c := range all {
			if !c.gone.Load() {
				c.ours.Store(true)
				c.ws.Close()
			}
		}
		mu.Unlock()
		if !waitFor(&l.live, 30*time.Second) {
			// Whatever is left: the reads end, each with Closed.
			srv.Close()
			rwg.Wait()
		}
	}
	fmt.Fprintln(out, resultLine(l, l.mark()))
	return nil
}

// waitFor waits for wg at most d and says whether it was done.
func waitFor(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// resultLine is the RESULT line, with the ping→pong figures of h.
func resultLine(l *load, h *latency.Histogram) string {
	return fmt.Sprintf("RESULT conns=%d failed=%d dropped=%d closed=%d pings=%d pongs=%d guides=%d guide_ids=%d %s",
		l.connected.Load(), l.failed.Load(), l.dropped.Load(), l.closed.Load(),
		l.pings.Load(), l.pongs.Load(), l.guides.Load(), l.distinctGuides(), pongFields(h))
}

// pongFields are the ping→pong figures of h, as RESULT and mark lines
// carry them.
func pongFields(h *latency.Histogram) string {
	ms := func(q float64) float64 { return float64(h.Quantile(q).Microseconds()) / 1000 }
	return fmt.Sprintf("pong_n=%d pong_p50_ms=%.3f pong_p99_ms=%.3f pong_p999_ms=%.3f pong_max_ms=%.3f pong_hist=%s",
		h.Count(), ms(0.5), ms(0.99), ms(0.999), ms(1), h)
}
