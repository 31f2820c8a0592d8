// Package gateway is the WebSocket edge of stillthere. Chat clients connect
// to its public listener with a JWT; each app-level ping renews the user's
// session in Redis. On its internal listener it serves the push endpoint
// through which the guide consumer delivers "are you still there?" to
// connected users, plus health and metrics. The wire contract is in
// docs/protocol.md.
//
// Each instance heartbeats to Redis, and when Redis was out of its reach,
// it records that as a blind interval and restores its users' grants, so
// that the expiry listener does not take an outage for their silence.
// Failures are logged once per outage, through outage.Log, not per call.
package gateway

import (
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
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

	"github.com/stillthere/stillthere/pkg/admin"
	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/outage"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/token"
)

// Gateway is a running gateway: open with New, then Serve.
type Gateway struct {
	cfg      Config
	log      *slog.Logger
	rdb      redis.UniversalClient
	store    *session.Store
	renewer  *session.Renewer
	policy   *policy.Watcher
	verifier *token.Verifier
	hub      *hub
	upgrader websocket.Upgrader

	instance         string        // this instance's name in route keys and heartbeats
	sub              *redis.PubSub // its channel, for guides routed here
	publicLn, pushLn net.Listener
	conns            sync.WaitGroup // one per connection being served
	maxConns         int64
	open             atomic.Int64 // connections held or being upgraded

	start time.Time // New's time; connections time their pings from it
	reach *reach    // whether Redis answers renewals and heartbeats

	// One outage log per condition: a line when it starts failing, a
	// summary now and then, a line when it ends, not a line per call.
	renewLog, endLog, beatLog, resyncLog *outage.Log
	routeLog, pushLog, channelLog        *outage.Log
}

// Run opens a gateway and serves until ctx is done.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	g, err := New(ctx, cfg, logger)
	if err != nil {
		return err
	}
	return g.Serve(ctx)
}

// New connects to Redis and binds both listeners.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gateway config: %w", err)
	}
	verifier, err := token.NewVerifier([]byte(cfg.TokenSecret))
	if err != nil {
		return nil, err
	}
	rdb, err := redisconn.Open(ctx, cfg.Redis)
	if err != nil {
		return nil, err
	}
	if err := redisconn.CheckEviction(ctx, rdb); err != nil {
		logger.Warn("Redis may evict session keys", "err", err)
	}
	store := session.NewStore(rdb, cfg.Redis.Keyspace())
	g := &Gateway{
		cfg:      cfg,
		log:      logger,
		rdb:      rdb,
		store:    store,
		instance: cmp.Or(cfg.InstanceID, newInstanceID()),
		verifier: verifier,
		hub:      newHub(),
		upgrader: websocket.Upgrader{
			HandshakeTimeout: cfg.HandshakeTimeout,
			// Client frames are small; the read buffer only sizes syscalls.
			// Writes borrow a buffer from the pool while they run.
			ReadBufferSize:    512,
			WriteBufferSize:   1024,
			WriteBufferPool:   &sync.Pool{},
			EnableCompression: false,
			// The Origin is checked before the upgrade, with a JSON 403.
			CheckOrigin: func(*http.Request) bool { return true },
		},
		start:      time.Now(),
		reach:      newReach(cfg.RenewFlushInterval),
		renewLog:   outage.NewLog(logger, "renew sessions", 0),
		endLog:     outage.NewLog(logger, "end sessions", 0),
		beatLog:    outage.NewLog(logger, "heartbeat", 0),
		resyncLog:  outage.NewLog(logger, "resync sessions", 0),
		routeLog:   outage.NewLog(logger, "route bookkeeping", 0),
		pushLog:    outage.NewLog(logger, "push guides", 0),
		channelLog: outage.NewLog(logger, "instance channel", 0),
	}
	g.renewer = session.NewRenewer(store, session.RenewerConfig{
		FlushInterval: cfg.RenewFlushInterval,
		MaxBatch:      cfg.RenewBatch,
		Instance:      g.instance,
		OnFlush: func(size int, took time.Duration, err error) {
			metricRenewRoundTrips.Inc()
			metricRenewBatchSize.Observe(float64(size))
			metricRenewFlushSeconds.Observe(took.Seconds())
			g.reach.flushed(took, err)
		},
	})
	g.policy = policy.NewWatcher(policy.NewStore(rdb, cfg.Redis.Keyspace()),
		policy.Policy{DefaultTTL: cfg.SessionTTL, Jitter: cfg.SessionJitter},
		cfg.PolicyRefresh, logger)
	if err := g.policy.Refresh(ctx); err != nil {
		logger.Warn("timeout policy unreadable; using the configured TTL until it is fixed", "err", err)
	}
	// Subscribed before any connection registers, so no routed guide is
	// published to a channel nobody reads yet.
	g.sub = rdb.SSubscribe(ctx, g.store.Keyspace().InstanceChannel(g.instance))
	if _, err := g.sub.Receive(ctx); err != nil {
		g.sub.Close()
		rdb.Close()
		return nil, fmt.Errorf("subscribe to the instance channel: %w", err)
	}
	// Alive before it takes connections. Redis answered just now; if it
	// does not here, the heartbeat loop keeps trying, and readyz fails
	// until it succeeds.
	g.beat(ctx)
	g.maxConns = int64(cfg.MaxConns)
	if g.maxConns == 0 {
		g.maxConns = connLimitFromRlimit()
	}
	if g.publicLn, err = net.Listen("tcp", cfg.Addr); err != nil {
		g.leave()
		g.sub.Close()
		rdb.Close()
		return nil, fmt.Errorf("listen on gateway-addr: %w", err)
	}
	if g.pushLn, err = net.Listen("tcp", cfg.PushAddr); err != nil {
		g.publicLn.Close()
		g.leave()
		g.sub.Close()
		rdb.Close()
		return nil, fmt.Errorf("listen on push-addr: %w", err)
	}
	return g, nil
}

// PublicAddr is where clients connect.
func (g *Gateway) PublicAddr() net.Addr { return g.publicLn.Addr() }

// PushAddr is the internal listener's address.
func (g *Gateway) PushAddr() net.Addr { return g.pushLn.Addr() }

// Serve serves both listeners until ctx is done, then drains: it stops
// accepting, tells every client to reconnect elsewhere (close 1001, which
// leaves sessions alive), waits for connections to end within the
// shutdown timeout, flushes the renewals still queued, marks the instance
// gone (Leave), and releases Redis.
func (g *Gateway) Serve(ctx context.Context) error {
	defer g.rdb.Close()
	// The renewer and the heartbeat outlive the connections: they stop
	// after the drain, and only then does the instance leave. A heartbeat
	// that stopped before the drain would let the lease run out while
	// users are still connected.
	bctx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	background.Go(func() { g.renewer.Run(bctx) })
	background.Go(func() { g.heartbeat(bctx) })
	defer func() {
		stopBackground()
		background.Wait()
		g.leave()
	}()
	var loops sync.WaitGroup
	defer loops.Wait()
	loops.Go(func() { g.policy.Run(ctx) })
	loops.Go(func() { g.resyncLoop(ctx) })

	public := &http.Server{
		Handler:           g.publicMux(ctx),
		ReadHeaderTimeout: g.cfg.HandshakeTimeout,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	push := &http.Server{
		Handler:           g.pushMux(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	g.log.Info("gateway listening", "public", g.PublicAddr().String(), "push", g.PushAddr().String(), "instance", g.instance)

	loops.Go(func() { g.listen(ctx, g.sub) })
	loops.Go(func() { g.pingAll(ctx) })

	eg, ectx := errgroup.WithContext(ctx)
	eg.Go(func() error { return serveUntil(ectx, public, g.publicLn) })
	eg.Go(func() error { return serveUntil(ectx, push, g.pushLn) })
	err := eg.Wait()

	g.drain()
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

// pingAll sends every connection a protocol ping once per 9/10 of the idle
// timeout, one hub shard per tick, so the pings are spread over the period
// and no connection needs a timer of its own.
func (g *Gateway) pingAll(ctx context.Context) {
	t := time.NewTicker(g.cfg.IdleTimeout * 9 / 10 / hubShards)
	defer t.Stop()
	for shard := 0; ; shard = (shard + 1) % hubShards {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, c := range g.hub.shardConns(shard) {
			c.ping()
		}
	}
}

// drainConcurrency bounds the close frames sent at once on shutdown.
const drainConcurrency = 256

func (g *Gateway) drain() {
	conns := g.hub.all()
	g.log.Info("draining connections", "count", len(conns))
	var eg errgroup.Group
	eg.SetLimit(drainConcurrency)
	for _, c := range conns {
		eg.Go(func() error {
			c.closeWith(websocket.CloseGoingAway, "server shutting down, reconnect")
			return nil
		})
	}
	eg.Wait()
	done := make(chan struct{})
	go func() { g.conns.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(g.cfg.ShutdownTimeout):
		g.log.Warn("shutdown timeout: cutting off remaining connections")
		for _, c := range g.hub.all() {
			c.ws.NetConn().Close()
		}
		<-done
	}
}

func (g *Gateway) publicMux(ctx context.Context) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/ws", func(w http.ResponseWriter, r *http.Request) { g.serveWS(ctx, w, r) })
	return mux
}

// serveWS authenticates, upgrades and serves one client. ctx is the
// gateway's: a connection outlives its HTTP request.
func (g *Gateway) serveWS(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	if !g.originAllowed(r) {
		metricRejected.WithLabelValues("origin").Inc()
		admin.WriteError(w, http.StatusForbidden, "origin not allowed")
		return
	}
	claims, err := g.verifier.Verify(bearer(r))
	if err != nil {
		metricRejected.WithLabelValues("token").Inc()
		admin.WriteError(w, http.StatusUnauthorized, err.Error())
		return
	}
	if g.open.Add(1) > g.maxConns {
		g.open.Add(-1)
		metricRejected.WithLabelValues("full").Inc()
		w.Header().Set("Retry-After", "1")
		admin.WriteError(w, http.StatusServiceUnavailable, "gateway at its connection limit, try another")
		return
	}
	// From here the slot is the connection's: its goroutine gives it back.
	ws, err := g.upgrader.Upgrade(w, r, nil)
	if err != nil {
		g.open.Add(-1)
		return // the upgrader has answered with an HTTP error
	}
	c := &conn{
		g:       g,
		ws:      ws,
		uid:     claims.UID,
		segment: claims.Segment,
		log:     g.log.With("uid", claims.UID),
	}
	// One-time Redis work (route registration, the inbox) runs here, on
	// the handler's goroutine. The connection then gets a goroutine of its
	// own that only reads, and the handler returns: that frees the HTTP
	// server's per-request buffers (several KB), which a connection served
	// from the handler would pin for its whole life.
	g.hub.add(c)
	metricConnections.Inc()
	rctx := context.WithoutCancel(ctx) // route bookkeeping outlives shutdown
	if err := g.register(rctx, c.uid); err != nil {
		// Guides reach this connection only through this instance.
		g.routeLog.Fail(err)
	} else {
		g.routeLog.OK()
	}
	g.handOverInbox(rctx, c)
	g.conns.Add(1)
	go func() {
		defer g.conns.Done()
		defer g.open.Add(-1)
		c.serve(ctx)
		g.release(rctx, c)
	}()
}

// release forgets an ended connection.
func (g *Gateway) release(ctx context.Context, c *conn) {
	g.hub.remove(c)
	metricConnections.Dec()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := g.unregister(ctx, c.uid); err != nil {
		g.routeLog.Fail(err)
	}
}

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
	// through: a load balancer should send clients elsewhere.
	mux := admin.NewMux(func(ctx context.Context) error {
		if err := g.reach.err(); err != nil {
			return err
		}
		return g.rdb.Ping(ctx).Err()
	})
	mux.HandleFunc("POST /v1/push", g.servePush)
	return mux
}

// PushRequest is the body of POST /v1/push.
type PushRequest struct {
	ID   string `json:"id"`   // the guide's id, its idempotency key
	UID  string `json:"uid"`  // the user to guide
	Text string `json:"text"` // the guide's text
}

// Push outcomes, in the response's "status".
const (
	PushDelivered = "delivered" // handed to the user's connections, here or on other instances
	PushDuplicate = "duplicate" // this id was delivered or queued before
	PushQueued    = "queued"    // the user has no connection: kept for their next connect
)

// pushedTTL is how long a delivered guide id is remembered.
const pushedTTL = 24 * time.Hour

// maxGuideText bounds a guide's text.
const maxGuideText = 1024

func (g *Gateway) servePush(w http.ResponseWriter, r *http.Request) {
	got := bearer(r)
	if subtle.ConstantTimeCompare([]byte(got), []byte(g.cfg.PushSecret)) != 1 {
		metricPushes.WithLabelValues("rejected").Inc()
		admin.WriteError(w, http.StatusUnauthorized, "missing or wrong push credentials")
		return
	}
	var req PushRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		admin.WriteError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	switch {
	case req.ID == "" || len(req.ID) > frame.MaxIDLen:
		admin.WriteError(w, http.StatusBadRequest, fmt.Sprintf("id: want 1-%d characters", frame.MaxIDLen))
		return
	case !session.ValidUID(req.UID):
		admin.WriteError(w, http.StatusBadRequest, "uid: want 1-128 characters of [A-Za-z0-9._:@-]")
		return
	case req.Text == "" || len(req.Text) > maxGuideText:
		admin.WriteError(w, http.StatusBadRequest, fmt.Sprintf("text: want 1-%d bytes", maxGuideText))
		return
	}
	status, n, err := g.push(r.Context(), req)
	if err != nil {
		g.pushLog.Fail(fmt.Errorf("guide %s: %w", req.ID, err))
		admin.WriteError(w, http.StatusServiceUnavailable, "push unavailable, retry")
		return
	}
	g.pushLog.OK()
	metricPushes.WithLabelValues(status).Inc()
	admin.WriteJSON(w, http.StatusOK, map[string]any{"status": status, "connections": n})
}

// push delivers a guide once per id: the id is claimed in Redis first, and
// released again if the guide could be neither delivered nor kept, so a
// retry can.
func (g *Gateway) push(ctx context.Context, req PushRequest) (string, int, error) {
	key := g.store.Keyspace().PushedKey(req.UID, req.ID)
	fresh, err := g.rdb.SetNX(ctx, key, 1, pushedTTL).Result()
	if err != nil {
		return "", 0, fmt.Errorf("claim guide id: %w", err)
	}
	if !fresh {
		return PushDuplicate, 0, nil
	}
	status, n, err := g.route(ctx, req)
	if err != nil {
		if derr := g.rdb.Del(context.WithoutCancel(ctx), key).Err(); derr != nil {
			return "", 0, fmt.Errorf("%w; and release guide id: %v", err, derr)
		}
		return "", 0, err
	}
	return status, n, nil
}

func (g *Gateway) route(ctx context.Context, req PushRequest) (string, int, error) {
	n := g.deliverLocal(req)
	remote, err := g.deliverElsewhere(ctx, req)
	if n+remote > 0 {
		return PushDelivered, n + remote, nil // what went out stays out
	}
	if err != nil {
		return "", 0, err
	}
	if err := g.keep(ctx, req); err != nil {
		return "", 0, err
	}
	return PushQueued, 0, nil
}
