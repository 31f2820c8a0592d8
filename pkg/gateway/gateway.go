// Package gateway is the WebSocket edge of stillthere. Chat clients connect
// to its public listener with a JWT; each app-level ping renews the user's
// session in Redis. On its internal listener it serves the push endpoint
// through which the guide consumer delivers "are you still there?" to
// connected users, the activity endpoint through which a chat platform's
// servers report their users' activity and turns (when configured), plus
// health and metrics. The wire contract is in docs/protocol.md.
//
// Each instance heartbeats to Redis, and when Redis was out of its reach,
// it records that as a blind interval and restores its users' grants, so
// that the expiry listener does not take an outage for their silence.
// Failures are logged once per outage, through outage.Log, not per call.
package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/stillthere/stillthere/pkg/activity"
	"github.com/stillthere/stillthere/pkg/activityfeed"
	"github.com/stillthere/stillthere/pkg/admin"
	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/lifecycle"
	"github.com/stillthere/stillthere/pkg/outage"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/token"
	"github.com/stillthere/stillthere/pkg/wsread"
	"github.com/stillthere/stillthere/web"
)

// Gateway is an opened gateway: Open, then Run, then Close.
type Gateway struct {
	cfg   Config
	log   *slog.Logger
	rdb   redis.UniversalClient
	store *session.Store
	// ctlRdb and ctl are the control connection: the heartbeat, the
	// instances' heartbeats, blind intervals and leave. See Open.
	ctlRdb  redis.UniversalClient
	ctl     *session.Store
	renewer *session.Renewer
	// timeline records this gateway's decisions in users' timelines; nil
	// records nothing.
	timeline *timeline.Recorder
	policy   *policy.Watcher
	verifier *token.Verifier
	hub      *hub
	upgrader websocket.Upgrader
	// reader reads every client connection (see read.go).
	reader *wsread.Server
	// expiries is the one timer of the connections' tokens (see auth.go).
	expiries *expiries
	// frameInterval is the rate limit's time between two frames of a
	// connection, beyond its burst (see allowFrame).
	frameInterval time.Duration

	// runs ties Run to Close; joined is set from Open's first heartbeat
	// until the instance leaves, by Run or else by Close.
	runs   lifecycle.Runs
	joined bool

	instance         string        // this instance's name in route keys and heartbeats
	sub              *redis.PubSub // its channel, for guides routed here; Run's listen owns it
	routes           *routeBook    // the one writer of its route entries
	ahead            *aheadDrops   // takes proven guides kept ahead out of inboxes
	view             viewPtr       // the instances' heartbeats, read every heartbeat
	publicLn, pushLn net.Listener
	conns            sync.WaitGroup // one per goroutine of a connection being served
	connsMu          sync.Mutex     // guards draining and conns' growth
	// testSetup, when set, runs on a connection's handler after its
	// route is written and before it is tracked: tests begin a drain
	// there.
	testSetup func()
	draining  bool
	maxConns  int64
	open      atomic.Int64 // connections held or being upgraded

	start   time.Time     // Open's time; connections time their pings from it
	reach   *reach        // whether Redis answers renewals and heartbeats
	ongoing ongoingRecord // the renewal outage recorded while it lasts
	// beatFailed: the last heartbeat failed; beaten: one succeeded; shed:
	// this outage's connections were closed; echoAt: when to register
	// every user once more after a heartbeat gap; beatSent: when the last
	// heartbeat that succeeded was sent. The heartbeat loop's own.
	beatFailed, beaten, shed bool
	echoAt, beatSent         time.Time
	// restartSeen: watchRestarts saw a master restart, which the next
	// heartbeat that succeeds acts on as on data lost. masterRuns: each
	// master's run as Open read it, watchRestarts's own from then on.
	restartSeen atomic.Bool
	masterRuns  map[string]redisconn.Run
	// drainRec is the record of the drain so far, nil before it begins.
	drainRec *session.BlindInterval
	// dropped holds the grants of connections that dropped, for a resync.
	dropped *dropped
	// channel is the state of the subscription to its channel, which
	// Redis can take away (see channel.go).
	channel instanceChannel

	// activity applies the platform's activity, from POST /v1/activity
	// and, when enabled, from the activity topic (feed).
	activity *activityHandler
	feed     *activityfeed.Feed

	// One outage log per condition: a line when it starts failing, a
	// summary now and then, a line when it ends, not a line per call.
	renewLog, beatLog, resyncLog  *outage.Log
	routeLog, pushLog, channelLog *outage.Log
	activityLog                   *outage.Log
}

var _ lifecycle.Service = (*Gateway)(nil)

// Open connects to Redis, subscribes to the instance's channel, beats
// once and binds both listeners. What fails on the way is freed by Close.
func Open(ctx context.Context, cfg Config, logger *slog.Logger) (_ *Gateway, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gateway config: %w", err)
	}
	verifier, err := token.NewVerifier([]byte(cfg.TokenSecret), token.Rules{
		Issuer:      cfg.TokenIssuer,
		Audience:    cfg.TokenAudience,
		MaxLifetime: cfg.TokenMaxLifetime,
	})
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		cfg:      cfg,
		log:      logger,
		instance: cmp.Or(cfg.InstanceID, newInstanceID()),
		verifier: verifier,
		hub:      newHub(),
		expiries: newExpiries(),
		// Validate keeps it above 0.
		frameInterval: time.Duration(float64(time.Second) / cfg.RatePerSecond),
		upgrader: websocket.Upgrader{
			HandshakeTimeout: cfg.HandshakeTimeout,
			// Client frames are small (see readBufferSize). Writes
			// borrow a buffer from the pool while they run.
			ReadBufferSize:    readBufferSize(cfg.ReadMode),
			WriteBufferSize:   1024,
			WriteBufferPool:   &sync.Pool{},
			EnableCompression: false,
			// The Origin is checked before the upgrade, with a JSON 403.
			CheckOrigin: func(*http.Request) bool { return true },
		},
		start:       time.Now(),
		reach:       newReach(cfg.RenewFlushInterval, stallAfter(cfg.HeartbeatInterval), nil),
		renewLog:    outage.NewLog(logger, "renew sessions", 0),
		beatLog:     outage.NewLog(logger, "heartbeat", 0),
		resyncLog:   outage.NewLog(logger, "resync sessions", 0),
		routeLog:    outage.NewLog(logger, "route bookkeeping", 0),
		pushLog:     outage.NewLog(logger, "push guides", 0),
		channelLog:  outage.NewLog(logger, "instance channel", 0),
		activityLog: outage.NewLog(logger, "apply activity", 0),
	}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	if g.reader, err = newReader(cfg); err != nil {
		return nil, err
	}
	if g.rdb, err = redisconn.Open(ctx, cfg.Redis); err != nil {
		return nil, err
	}
	if err := redisconn.CheckEviction(ctx, g.rdb); err != nil {
		logger.Warn("Redis may evict session keys", "err", err)
	}
	// The masters as they run now: a restart from here on is one this
	// instance's users may have lost data in (see watchRestarts).
	var rerr error
	if g.masterRuns, rerr = redisconn.MasterRuns(ctx, g.rdb); rerr != nil {
		logger.Debug("read the Redis masters' run ids", "err", rerr)
	}
	// The heartbeat, and the records of this instance's outages, have a
	// connection of their own, the control connection. Queued behind a
	// burst of connection set-ups in the shared pool, the heartbeat ran
	// out its lease with Redis at hand, and after ShedAfter the gateway
	// cut off every client, whose reconnects made the next burst.
	// (Renewals are pipelines, which go-redis sends on a pool of their
	// own when the shared one is full.) A heartbeat that gets through so
	// no longer shows that renewals do: the shared pool is checked
	// before a renewal failure is taken as over (see beat).
	bc := cfg.Redis
	bc.PoolSize = 1
	if g.ctlRdb, err = redisconn.Open(ctx, bc); err != nil {
		return nil, err
	}
	// Its renewals and ends record, in their own scripts, a hold they
	// cancel on a user's timeout (see session.HoldNotes).
	g.store = session.NewStore(g.rdb, cfg.Redis.Keyspace()).WithHoldNotes(cfg.Timeline.HoldNotes("gateway", g.instance))
	g.timeline = cfg.Timeline.Recorder(g.store, timeline.Config{Service: "gateway", Instance: g.instance, Log: logger})
	g.ctl = session.NewStore(g.ctlRdb, cfg.Redis.Keyspace())
	g.renewer = session.NewRenewer(g.store, session.RenewerConfig{
		FlushInterval: cfg.RenewFlushInterval,
		MaxBatch:      cfg.RenewBatch,
		Instance:      g.instance,
		// Renewals a migrating cluster slot refuses are sent again, but
		// only for as long as keeps the round trip under what reach
		// counts as an outage: one held up longer fails, and is one.
		SlotRetry: g.reach.slow * 3 / 4,
		// A ping whose renewal finds the queue full fails after a write
		// timeout, as a write to its client would.
		QueueWait: cfg.WriteTimeout,
		OnFlush: func(size int, took time.Duration, err error) {
			metricRenewRoundTrips.Inc()
			metricRenewBatchSize.Observe(float64(size))
			metricRenewFlushSeconds.Observe(took.Seconds())
			g.reach.flushed(took, err)
		},
		OnDropped: g.reach.dropped,
		// A ping whose user's route does not name this instance: a
		// node that restarted without its data lost the route with the
		// session (and whatever renewed first since, a ping here or
		// elsewhere, or the platform's activity, says nothing of this
		// instance's entry), or another instance dropped it. Pushes
		// elsewhere would find the user's connections here missing
		// until the next refresh: the route is written again.
		OnUnrouted: func(uid string) {
			metricRouteRewrites.Inc()
			g.routes.mark(uid, closeNone, nil)
		},
	})
	g.reach.waiting = g.renewer.Waiting
	g.routes = newRouteBook(g)
	g.ahead = newAheadDrops(g)
	g.activity = &activityHandler{
		secret:   cfg.ActivitySecret,
		store:    g.store,
		policy:   func() policy.Policy { return g.policy.Current() },
		instance: g.instance,
		now:      time.Now,
		log:      g.activityLog,
		timeline: g.timeline,
	}
	g.policy = policy.NewWatcher(policy.NewStore(g.rdb, cfg.Redis.Keyspace()),
		cfg.FallbackPolicy(), cfg.PolicyRefresh, cfg.RenewGranularity, logger)
	if err := g.policy.Refresh(ctx); err != nil {
		logger.Warn("timeout policy unreadable; using the configured TTL until it is fixed", "err", err)
	}
	// Subscribed before any connection registers, so no routed guide is
	// published to a channel nobody reads yet.
	if g.sub, err = g.subscribe(ctx, channelStartTimeout); err != nil {
		return nil, err
	}
	// Alive before it takes connections. Redis answered just now; if it
	// does not here, the heartbeat loop keeps trying, and readyz fails
	// until it succeeds. From here on, the instance leaves when it stops.
	g.joined = true
	g.beat(ctx)
	g.maxConns = int64(cfg.MaxConns)
	if g.maxConns == 0 {
		g.maxConns = connLimitFromRlimit()
	}
	// As many dropped grants as connections: a wave of drops of every
	// connection fits. Each lingers for a heartbeat's timeout after it
	// runs out, for an outage not seen yet.
	g.dropped = newDropped(g.start, int(g.maxConns), g.lease())
	if g.publicLn, err = net.Listen("tcp", cfg.Addr); err != nil {
		return nil, fmt.Errorf("listen on gateway-addr: %w", err)
	}
	if g.pushLn, err = net.Listen("tcp", cfg.PushAddr); err != nil {
		return nil, fmt.Errorf("listen on push-addr: %w", err)
	}
	if cfg.ActivityFeed.Enabled {
		if g.feed, err = activityfeed.Open(ctx, cfg.ActivityFeed, g.store, g.activity.prepareRecords, logger.With("component", "activity-feed")); err != nil {
			return nil, fmt.Errorf("activity feed: %w", err)
		}
	}
	return g, nil
}

// Close stops Run if it runs and waits for it (see Run), then frees what
// Open took: a gateway that never ran, or whose Run could not, leaves
// first, so that the listener does not wait out its lease. Later calls
// return the first one's error.
func (g *Gateway) Close() error {
	return g.runs.Close(func() error {
		if g.joined {
			g.leave()
			g.joined = false
		}
		if g.sub != nil && !g.runs.Ran() {
			g.sub.Close()
		}
		// Run's servers closed them already, if it ran.
		for _, ln := range []net.Listener{g.publicLn, g.pushLn} {
			if ln != nil {
				ln.Close()
			}
		}
		if g.feed != nil {
			g.feed.Close() // Run stopped it already, if it ran
		}
		var errs []error
		if g.reader != nil {
			errs = append(errs, g.reader.Close())
		}
		for _, rdb := range []redis.UniversalClient{g.rdb, g.ctlRdb} {
			if rdb != nil {
				errs = append(errs, rdb.Close())
			}
		}
		return errors.Join(errs...)
	})
}

// PublicAddr is where clients connect.
func (g *Gateway) PublicAddr() net.Addr { return g.publicLn.Addr() }

// PushAddr is the internal listener's address.
func (g *Gateway) PushAddr() net.Addr { return g.pushLn.Addr() }

// Run serves both listeners until ctx is done or Close is called, then
// drains: it stops accepting, tells every client to reconnect elsewhere
// (close 1001, which leaves sessions alive), waits for connections to end
// within the shutdown timeout, flushes the renewals still queued, and
// marks the instance gone (Leave). Close then releases Redis.
func (g *Gateway) Run(ctx context.Context) error {
	ctx, end, err := g.runs.Start(ctx)
	if err != nil {
		return err
	}
	defer end()
	// The renewer, the heartbeat, the route writer and the token timer
	// outlive the connections: they stop after the drain, and only then
	// does the instance leave. A heartbeat that stopped before the drain would let
	// the lease run out while users are still connected.
	bctx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { g.renewer.Run(bctx); return nil })
	if g.timeline != nil {
		eg.Go(func() error { g.timeline.Run(bctx); return nil })
	}
	// The reader outlives the drain too: the connections it reads end in it.
	eg.Go(func() error { return g.reader.Run(bctx) })
	eg.Go(func() error { g.heartbeat(bctx); return nil })
	eg.Go(func() error { g.watchRestarts(bctx); return nil })
	eg.Go(func() error { g.routes.run(bctx); return nil })
	eg.Go(func() error { g.ahead.run(bctx); return nil })
	eg.Go(func() error { g.expiries.run(bctx); return nil })
	eg.Go(func() error { g.policy.Run(ctx); return nil })
	eg.Go(func() error { g.resyncLoop(ctx); return nil })
	eg.Go(func() error {
		g.dropped.sweep(ctx, func() time.Time { from, _ := g.reach.outage(); return from })
		return nil
	})
	eg.Go(func() error { g.recordLoop(ctx); return nil })
	if g.feed != nil {
		eg.Go(func() error { g.feed.Run(ctx); return nil })
	}

	// The public listener's only use is the upgrade: a connection that
	// has not upgraded within the handshake timeout is closed, and so is
	// one after any other answer (see publicMux), so a stranger cannot
	// park connections that max-conns does not count. An upgraded
	// connection sets its own deadlines.
	public := &http.Server{
		Handler:           g.publicMux(ctx),
		ReadHeaderTimeout: g.cfg.HandshakeTimeout,
		ReadTimeout:       g.cfg.HandshakeTimeout,
		IdleTimeout:       g.cfg.HandshakeTimeout,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	// No write timeout on the internal listener: a CPU profile streams
	// for as long as it was asked to.
	push := &http.Server{
		Handler:           g.pushMux(),
		ReadHeaderTimeout: min(10*time.Second, g.cfg.pushIdleTimeout()),
		ReadTimeout:       pushReadTimeout,
		IdleTimeout:       g.cfg.pushIdleTimeout(),
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	g.log.Info("gateway listening", "public", g.PublicAddr().String(), "push", g.PushAddr().String(), "instance", g.instance,
		"least_ping_margin", PingMargin(g.cfg.HeartbeatInterval))

	eg.Go(func() error { g.listen(ctx, g.sub); return nil })
	eg.Go(func() error { g.pingAll(ctx); return nil })
	// The drain begins once both listeners stopped accepting, and the
	// background loops stop after it.
	served := make(chan struct{}, 2)
	eg.Go(func() error {
		defer func() { served <- struct{}{} }()
		return serveUntil(ctx, public, g.publicLn)
	})
	eg.Go(func() error {
		defer func() { served <- struct{}{} }()
		return serveUntil(ctx, push, g.pushLn)
	})
	eg.Go(func() error {
		<-served
		<-served
		g.drain()
		stopBackground()
		return nil
	})
	err = eg.Wait()
	g.leave()
	g.joined = false
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// serveUntil serves ln until ctx is done, then stops accepting. Shutdown
// does not touch hijacked WebSocket connections; drain ends those.
func serveUntil(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	<-errc
	return ctx.Err()
}

// pingAll keeps every connection heard from within the idle timeout,
// without a timer of its own: it visits each one pingVisits times per
// timeout, one hub shard after another, and pings one not heard from (a
// message, a pong) for the timeout less two visits. The visit that first
// finds that pings it at most nine tenths of the timeout after it was
// last heard from, so its pong has the last tenth to come back, as when
// every connection was pinged every 9/10 of the timeout. A client that
// sends frames of its own more often than that (pings every 15 s under a
// 60 s timeout) is never pinged: its frames are the sign of life, and a
// ping each would cost both ends a write, a read and a wakeup (a fifth
// of a gateway's frames at those cadences).
//
// The shards' turns are by the clock, not by ticks: a tick visits every
// shard whose turn has come, so ticks that come late or not at all (a
// ticker drops those its reader was too busy for) do not stretch a round
// past its visit and a quiet client's ping past its deadline.
func (g *Gateway) pingAll(ctx context.Context) {
	visit := g.cfg.IdleTimeout / pingVisits
	quiet := int64(g.cfg.IdleTimeout - 2*visit)
	round := pingRound{turn: visit / hubShards, next: time.Since(g.start)}
	t := time.NewTicker(max(round.turn, pingTick))
	defer t.Stop()
	var due []*conn
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Since(g.start)
		first, n := round.due(now)
		for i := range n {
			due = g.hub.appendShard(due[:0], (first+i)%hubShards, func(c *conn) bool { return int64(now)-c.heard.Load() >= quiet })
			for _, c := range due {
				c.ping()
			}
			clear(due)
		}
	}
}

// pingRound is pingAll's schedule: the hub shard whose turn is next, and
// when it comes (since the gateway started), a turn apart.
type pingRound struct {
	shard      int
	next, turn time.Duration
}

// due returns the shards whose turns have come by now: n of them from
// first on (wrapping), at most one round. A tick late or lost leaves
// more for the next; a round behind (a pause longer than a visit) is
// visited once, and the next turn is a turn after now.
func (r *pingRound) due(now time.Duration) (first, n int) {
	first = r.shard
	for n < hubShards && r.next <= now {
		n++
		r.next += r.turn
	}
	r.shard = (r.shard + n) % hubShards
	if r.next <= now {
		r.next = now + r.turn
	}
	return first, n
}

// pingVisits is how many times per idle timeout pingAll looks at a
// connection; pingTick is its shortest tick (a tick may visit several
// shards).
const (
	pingVisits = 10
	pingTick   = 10 * time.Millisecond
)

// drainConcurrency bounds the close frames sent at once on shutdown.
const drainConcurrency = 256

func (g *Gateway) drain() {
	g.connsMu.Lock()
	g.draining = true // connections still being set up close themselves
	g.connsMu.Unlock()
	// Recorded before the first client is told to go: from here on this
	// instance's users cannot renew through it, and their reconnects to
	// the rest of the fleet may take longer than what their grants have
	// left, more so when the whole instance reconnects at once to busy
	// ones. A user who was told to go and came back is not silent.
	g.recordDrain()
	conns := g.hub.all()
	g.log.Info("draining connections", "count", len(conns))
	var eg errgroup.Group
	eg.SetLimit(drainConcurrency)
	for _, c := range conns {
		eg.Go(func() error {
			c.closeNow(websocket.CloseGoingAway, "server shutting down, reconnect")
			return nil
		})
	}
	eg.Wait()
	done := make(chan struct{})
	go func() { g.conns.Wait(); close(done) }()
	// The drain is recorded again every heartbeat while it lasts, so that
	// it holds its users' timeouts until the grace after it ends however
	// long it takes, also when this process dies before it leaves.
	beat := time.NewTicker(g.cfg.HeartbeatInterval)
	defer beat.Stop()
	timeout := time.After(g.cfg.ShutdownTimeout)
	for waiting := true; waiting; {
		select {
		case <-done:
			return
		case <-beat.C:
			g.recordDrain()
		case <-timeout:
			waiting = false
		}
	}
	g.log.Warn("shutdown timeout: cutting off remaining connections")
	for _, c := range g.hub.all() {
		c.ws.NetConn().Close()
	}
	// What is left of a connection once cut off is its bookkeeping in
	// Redis (its route, the guides it never proved, each bounded by its
	// own timeout), and an inbox handover that ends with it. The wait is
	// bounded all the same: an instance stuck here would go on
	// heartbeating, listed and routed to, while it serves nobody.
	select {
	case <-done:
	case <-time.After(cutOffTimeout):
		g.log.Error("shutdown: connections still busy after the cut-off; leaving without them", "waited", cutOffTimeout)
	}
}

// cutOffTimeout bounds the drain's wait for the connections it cut off,
// which do their bookkeeping at once: a route write and a guide handed on
// (pushTimeout). A connection with more unproven guides, or stuck in a
// Redis call, is left to end with the process.
const cutOffTimeout = routeWriteTimeout + pushTimeout

// recordDrain records this instance's drain so far, from when it began to
// now by Redis's clock, as a blind interval of the instance
// (session.BlindDrain), each record replacing the last. The listener
// holds the timeouts of the instance's users whose deadlines fall in it
// or within the grace after it, so that those who reconnected elsewhere
// have renewed by then. The drain and then leave own it, one after the
// other (see Run). A record that fails leaves the last one standing, and the
// next heartbeat's tries again; while Redis is out of reach, the gap in
// this instance's heartbeats holds its users instead.
func (g *Gateway) recordDrain() {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	var since time.Time
	if g.drainRec != nil {
		since = g.drainRec.Start
	}
	b, err := g.ctl.RecordBlindSince(ctx, since, g.instance, session.BlindDrain, g.drainRec)
	if err != nil {
		g.log.Warn("record the drain; the listener holds this instance's users by its heartbeats alone", "err", err)
		return
	}
	g.drainRec = &b
}

func (g *Gateway) publicMux(ctx context.Context) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/ws", func(w http.ResponseWriter, r *http.Request) { g.serveWS(ctx, w, r) })
	if g.cfg.DemoPage {
		// Same origin as the WebSocket, so the default Origin policy
		// lets the page connect.
		mux.Handle("GET /demo/", http.StripPrefix("/demo/", web.Demo()))
		if g.cfg.DemoBot != nil {
			// The page's chat partner, same origin too: the page's
			// Content-Security-Policy lets it post here and nowhere else.
			mux.Handle("POST /demo/bot", g.cfg.DemoBot)
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Every answer but an upgrade (which writes its own) ends the
		// connection: a client that was refused reconnects to retry.
		w.Header().Set("Connection", "close")
		mux.ServeHTTP(w, r)
	})
}

// serveWS authenticates, upgrades and serves one client. ctx is the
// gateway's: a connection outlives its HTTP request.
func (g *Gateway) serveWS(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	// The handler is counted among the connections' goroutines, which the
	// drain and so Run and Close wait for: an HTTP server's Shutdown does
	// not wait for the handler of an upgraded connection, and one the
	// drain turns away still writes its route and hands on its guides.
	if !g.track(1) {
		metricRejected.WithLabelValues("draining").Inc()
		w.Header().Set("Retry-After", "1")
		admin.WriteError(w, http.StatusServiceUnavailable, "gateway shutting down, try another")
		return
	}
	defer g.conns.Done()
	if !g.originAllowed(r) {
		metricRejected.WithLabelValues("origin").Inc()
		admin.WriteError(w, http.StatusForbidden, "origin not allowed")
		return
	}
	raw := bearer(r)
	claims, err := g.verifier.Verify(raw)
	if err == nil && len(raw) > frame.MaxTokenLen {
		// It could never be refreshed: an auth frame holds no longer one.
		err = fmt.Errorf("token of %d characters, want at most %d", len(raw), frame.MaxTokenLen)
	}
	if err != nil {
		metricRejected.WithLabelValues("token").Inc()
		admin.WriteError(w, http.StatusUnauthorized, err.Error())
		return
	}
	device, err := deviceOf(r)
	if err != nil {
		metricRejected.WithLabelValues("device").Inc()
		admin.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	// The user's cap first: a user at it is told so (429), also when the
	// instance is full, and takes no slot of the instance's meanwhile.
	if !g.hub.reserve(claims.UID, g.cfg.maxUserConns()) {
		metricRejected.WithLabelValues("user_full").Inc()
		w.Header().Set("Retry-After", userFullRetryAfter)
		admin.WriteError(w, http.StatusTooManyRequests,
			fmt.Sprintf("user at its connection limit on this gateway (%d): close another connection first", g.cfg.maxUserConns()))
		return
	}
	if g.open.Add(1) > g.maxConns {
		g.open.Add(-1)
		g.hub.unreserve(claims.UID)
		metricRejected.WithLabelValues("full").Inc()
		w.Header().Set("Retry-After", "1")
		admin.WriteError(w, http.StatusServiceUnavailable, "gateway at its connection limit, try another")
		return
	}
	// From here the slot and the user's place are the connection's: its
	// goroutine gives them back (release, then open).
	rc, err := g.reader.Upgrade(&g.upgrader, w, r, nil)
	if err != nil {
		g.open.Add(-1)
		g.hub.unreserve(claims.UID)
		return // the upgrader has answered with an HTTP error
	}
	c := &conn{
		g:        g,
		ws:       rc.WS(),
		rd:       rc,
		uid:      claims.UID,
		segment:  claims.Segment,
		openedMS: g.redisNowMS(),
	}
	// One-time Redis work (route registration, the first of the inbox)
	// runs here, on the handler's goroutine. The connection then gets a
	// reader (read.go) that only reads, and the handler returns: that
	// frees the HTTP server's per-request buffers (several KB), which a
	// connection served from the handler would pin for its whole life.
	// The route is written before the inbox is read: a push that finds
	// the user connected nowhere and keeps a guide meanwhile either sees
	// the route and routes again, or keeps it before the inbox is read.
	c.expiresSec.Store(tokenSec(claims.Expires))
	rctx := context.WithoutCancel(ctx) // route bookkeeping outlives shutdown
	// A client that says its first frame is a ping gets its guides after
	// it, judged by what it says of its user (see present.go).
	held := r.URL.Query().Get("first") == frame.TypePing
	if held {
		g.holdGuides(rctx, c)
	}
	g.hub.add(c, g.start)
	metricConnections.Inc()
	wctx, cancel := context.WithTimeout(rctx, routeWriteTimeout)
	res := g.routes.writeResult(wctx, c.uid, closeNone)
	if res.Err != nil {
		// Guides reach this connection through this instance until the
		// writer's retry gets through.
		g.routeLog.Fail(res.Err)
	}
	cancel()
	if g.timeline != nil {
		// After the write, which says whether the user is connected
		// elsewhere too. A guide pushed while it was under way reached
		// this connection already, and may be recorded first.
		e := startEntry(c.segment, g.hub.count(c.uid), res, held)
		e.Device = device
		g.timeline.Record(c.uid, e)
	}
	var rest *handover
	// The write said whether the inbox holds anything: most connects find
	// it empty, and skip a script and a round trip each. (A burst of
	// connects, each waiting on its take, once held 2,500 goroutines and
	// the whole shared pool, and its load on Redis delayed every pong by
	// seconds.) A guide kept here after the write is offered to this
	// connection by the keep (see keep); one kept by another instance's
	// push with a route check saw this connection's count rise and was
	// routed here. A connection that holds its guides takes its inbox
	// when its hold ends, whatever the write found.
	if !held && (res.Err != nil || res.Inbox) {
		rest = g.handOverInbox(rctx, c, noPresence)
	}
	n := 1
	if rest != nil {
		n = 2
	}
	if g.testSetup != nil {
		g.testSetup()
	}
	if !g.track(n) {
		// The drain began while this one was being set up: it is told to
		// reconnect like the others, and ends as a served one does
		// (finish ends its hold, and tells the handovers that wait on it:
		// another connection's release may have offered it the inbox
		// meanwhile, from a goroutine the drain waits for). Nothing reads
		// it, so this handler waits here, as a reader would.
		c.closeWith(websocket.CloseGoingAway, "server shutting down, reconnect")
		// The close goes out after the inbox guides queued before it, if
		// any, from their flusher: stop would cut it off, and the client
		// take a dropped connection's backoff for a 1001's reconnect at
		// once. No frame is queued after the close.
		c.waitFlushed()
		rc.Discard(lingerTimeout)
		c.stop()
		c.finish(rctx)
		if rest != nil {
			// Nothing proves a guide on it now: the rest of the handover
			// releases their leases at once, for the reconnect elsewhere,
			// instead of when they lapse.
			rest.run(rctx)
		}
		g.open.Add(-1)
		g.release(rctx, c, websocket.CloseGoingAway, true)
		return
	}
	c.armExpiry()
	c.prepare()
	// Its count in conns and its slot in open are the reader's from here:
	// Closed gives them back.
	g.reader.Serve(rc, c)
	if rest != nil {
		go func() {
			defer g.conns.Done()
			rest.run(rctx)
		}()
	}
}

// track counts n goroutines of a connection into conns, unless the drain
// has begun: an HTTP server's Shutdown does not wait for the handlers of
// upgraded connections, so one may still be setting up while the drain
// waits, and a WaitGroup must not grow from zero during its Wait.
func (g *Gateway) track(n int) bool {
	g.connsMu.Lock()
	defer g.connsMu.Unlock()
	if g.draining {
		return false
	}
	g.conns.Add(n)
	return true
}

// release forgets an ended connection: it counts it out of the user's
// route and, after a normal close, ends the session if that was the
// user's last connection on any instance; then it hands on the guides the
// client never proved it got (see proof.go). code is the connection's
// close code, ours whether the gateway closed it (see endCode): the
// user's timeline records the end with them.
func (g *Gateway) release(ctx context.Context, c *conn, code int, ours bool) {
	g.hub.remove(c)
	if !c.normalClose() {
		g.dropped.add(c)
	}
	metricConnections.Dec()
	wctx, cancel := context.WithTimeout(ctx, routeWriteTimeout)
	defer cancel()
	res := g.routes.writeResult(wctx, c.uid, c.routeClose())
	if res.Err != nil {
		// The writer keeps the user marked, and retries.
		g.routeLog.Fail(res.Err)
	}
	if g.timeline != nil {
		g.timeline.Record(c.uid, endEntry(c.segment, code, ours, c.normalClose(), res))
	}
	g.handOn(ctx, c) // after the route write: a normal close makes them stale
}

// userFullRetryAfter is the Retry-After of a refusal at the per-user cap:
// a place comes free only when one of the user's connections ends, so
// retrying at once does not help.
const userFullRetryAfter = "5"

// connLimitFromRlimit leaves 1024 descriptors of the open-file limit for
// Redis, listeners and the push endpoint's clients.
func connLimitFromRlimit() int64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<30 {
		return 1 << 30
	}
	return max(int64(lim.Cur)-1024, 64)
}

// bearer finds the client's token: the Authorization header, or for
// browsers, which cannot set headers on a WebSocket, the token parameter.
func bearer(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		if t, ok := strings.CutPrefix(h, "Bearer "); ok {
			return strings.TrimSpace(t)
		}
		return ""
	}
	return r.URL.Query().Get("token")
}

// originAllowed applies the Origin policy. Requests without an Origin come
// from native clients, which no browser policy concerns.
func (g *Gateway) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	if len(g.cfg.AllowedOrigins) > 0 {
		for _, o := range g.cfg.AllowedOrigins {
			if strings.EqualFold(o, origin) {
				return true
			}
		}
		return false
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

func (g *Gateway) pushMux() http.Handler {
	// Not ready while renewals or heartbeats fail, even if a PING gets
	// through: a load balancer should send clients elsewhere. Nor while
	// the instance channel is not subscribed: guides routed here from
	// other instances reach nobody.
	mux := admin.NewMux(func(ctx context.Context) error {
		if err := g.reach.err(); err != nil {
			return err
		}
		if err := g.channel.err(); err != nil {
			return err
		}
		return g.rdb.Ping(ctx).Err()
	}, g.cfg.Pprof)
	mux.HandleFunc("POST "+push.Path, g.servePush)
	// Every method: the handler answers 404 while off, and 405 to methods
	// but POST while on.
	mux.Handle(activity.Path, g.activity)
	if g.cfg.OpsSecret != "" {
		mux.Handle(timeline.Path, timeline.Handler(g.store, g.cfg.OpsSecret, g.cfg.Timeline.Bounds.Keep))
	}
	return mux
}
