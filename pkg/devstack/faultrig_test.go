package devstack

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/expiry"
	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/guide/guidetest"
	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/timeoutevent/topictest"
	"github.com/stillthere/stillthere/pkg/token"
)

// Timing of the fault tests: a TTL of seconds, so that a fault of twice
// the TTL and the grace after it fit in a test.
const (
	faultTTL    = 2 * time.Second
	faultJitter = 200 * time.Millisecond
	// faultGrace is the listener's outage grace: a client that pings at
	// least once a TTL has pinged within it, a second to reconnect
	// included.
	faultGrace = faultTTL + faultJitter + time.Second
	// faultLength is how long a fault that lasts lasts.
	faultLength = 2 * faultTTL
	// heartbeatInterval is the gateways' (a lease of three).
	heartbeatInterval = 200 * time.Millisecond
)

// rigOptions say what a faultRig is built on.
type rigOptions struct {
	// Cluster runs a 3-master Redis Cluster with a replica per master;
	// otherwise one redis-server, which gateways reach through a proxy
	// each.
	Cluster bool
	// AOF keeps the single redis-server's writes on disk, for a restart.
	AOF bool
	// Gateways is the number of gateway instances to start.
	Gateways int
	// ActivityFeed makes the gateways the activity topic's consumer group.
	ActivityFeed bool
	// KafkaPath puts the in-process Kafka behind a proxy that every
	// client's connection goes through (kafkaPath), to cut it.
	KafkaPath bool
	// Policy, when set, is the timeout policy stored before any service
	// starts.
	Policy *policy.Policy
}

// faultRig is the pipeline assembled by hand, for faults Start cannot
// stage. Each gateway instance reaches a single Redis through a proxy of
// its own (cut to part it from Redis, or as part of killing it), and
// clients reach it through another (cut as a crash cuts them). The
// listener and the consumer talk to Redis directly; the consumer sends
// guides to a webhook that counts them per user.
type faultRig struct {
	t           *testing.T
	log         *slog.Logger
	prefix      string
	tokenSecret string
	pushSecret  string
	redis       *redisserver.Server  // nil on a cluster
	cluster     *redisserver.Cluster // nil on a single Redis
	brokers     string
	topic       string
	hook        *guidetest.Webhook
	kafka       *kfake.Cluster
	kafkaPath   *tcpproxy.Proxy // nil unless rigOptions.KafkaPath
	feed        bool            // the gateways consume the activity topic

	mu       sync.Mutex // guards gateways and started
	gateways []*rigGateway
	started  int
}

// rigGateway is one gateway instance of the rig.
type rigGateway struct {
	id    string
	gw    *gateway.Gateway
	front *tcpproxy.Proxy // clients' path to it
	back  *tcpproxy.Proxy // its path to Redis; nil on a cluster
	svc   *lifecycletest.Running
}

// newBareRig is a rig with its logs, key prefix, secrets and topic, and
// nothing started yet.
func newBareRig(t *testing.T) *faultRig {
	return &faultRig{
		t:           t,
		log:         serviceLog(t),
		prefix:      redistest.Prefix(t),
		tokenSecret: randomSecret(),
		pushSecret:  randomSecret(),
		topic:       "session-timeouts",
	}
}

// startKafka starts the rig's in-process Kafka and its webhook receiver,
// both stopped at cleanup.
func (r *faultRig) startKafka(opts ...kfake.Opt) *kfake.Cluster {
	r.t.Helper()
	kc := kafkatest.StartFake(r.t, opts...)
	r.brokers = kc.ListenAddrs()[0]
	r.hook = guidetest.StartWebhook(r.t)
	return kc
}

// startKafkaBehindProxy is startKafka with the broker behind a proxy,
// kept in r.kafkaPath: the broker listens on a port of its own and
// names the proxy's address as its own, so that every client reaches
// it through the proxy, after the seed as well (a metadata answer names
// the broker to dial next).
func (r *faultRig) startKafkaBehindProxy() *kfake.Cluster {
	r.t.Helper()
	listen := func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		if err != nil {
			return nil, err
		}
		p, err := tcpproxy.Start(ln.Addr().String())
		if err != nil {
			ln.Close()
			return nil, err
		}
		addr, err := net.ResolveTCPAddr("tcp", p.Addr())
		if err != nil {
			p.Close()
			ln.Close()
			return nil, err
		}
		// One broker: the cleanup closes the proxy after the broker.
		r.kafkaPath = p
		r.t.Cleanup(func() { p.Close() })
		return advertised{Listener: ln, addr: addr}, nil
	}
	return r.startKafka(kfake.ListenFn(listen))
}

// advertised is a listener that gives another address as its own.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (l advertised) Addr() net.Addr { return l.addr }

// listenerConfig is the rig's listener: quick sweeps, and the rig's
// outage grace.
func (r *faultRig) listenerConfig() (expiry.Config, error) {
	return expiry.LoadConfig(nil, r.env(map[string]string{
		"STILLTHERE_LISTENER_ADMIN_ADDR": "127.0.0.1:0",
		"STILLTHERE_SWEEP_INTERVAL":      "100ms",
		"STILLTHERE_SWEEP_GAP_MAX":       "1s",
		"STILLTHERE_OUTAGE_GRACE":        faultGrace.String(),
		"STILLTHERE_SPOOL_DIR":           r.t.TempDir(),
	}))
}

// consumerConfig is the rig's consumer: sends bounded to 2s and a
// breaker that tries again after 500ms, plus extra (its sender).
func (r *faultRig) consumerConfig(extra map[string]string) (guide.Config, error) {
	env := map[string]string{
		"STILLTHERE_CONSUMER_ADMIN_ADDR": "127.0.0.1:0",
		"STILLTHERE_SEND_TIMEOUT":        "2s",
		"STILLTHERE_BREAKER_TIMEOUT":     "500ms",
	}
	maps.Copy(env, extra)
	return guide.LoadConfig(nil, r.env(env))
}

func newFaultRig(t *testing.T, opts rigOptions) *faultRig {
	t.Helper()
	r := newBareRig(t)
	ctx := context.Background()
	if opts.Cluster {
		c, err := redisserver.StartCluster(ctx, t.TempDir(), 3)
		if err != nil {
			t.Fatalf("start redis cluster: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.AddReplicas(ctx); err != nil {
			t.Fatalf("add replicas: %v", err)
		}
		r.cluster = c
	} else {
		srv, err := redisserver.Start(ctx, redisserver.Options{Dir: t.TempDir(), AOF: opts.AOF})
		if err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		t.Cleanup(func() { srv.Close() })
		r.redis = srv
	}
	if opts.KafkaPath {
		r.kafka = r.startKafkaBehindProxy()
	} else {
		r.kafka = r.startKafka()
	}
	r.feed = opts.ActivityFeed
	if opts.Policy != nil {
		if err := policy.NewStore(r.client(), r.keyspace()).Save(ctx, *opts.Policy); err != nil {
			t.Fatal(err)
		}
	}

	// The listener creates the topic, so it opens before the consumer.
	lcfg, err := r.listenerConfig()
	if err != nil {
		t.Fatal(err)
	}
	lifecycletest.Start(t, expiry.Open, lcfg, r.log.With("service", "expiry-listener"))

	ccfg, err := r.consumerConfig(map[string]string{
		"STILLTHERE_SENDER":         guide.SenderWebhook,
		"STILLTHERE_WEBHOOK_URL":    r.hook.URL,
		"STILLTHERE_WEBHOOK_SECRET": r.hook.Secret,
		// A mass leave releases thousands of held guides at once.
		"STILLTHERE_MAX_IN_FLIGHT": "2048",
	})
	if err != nil {
		t.Fatal(err)
	}
	lifecycletest.Start(t, guide.Open, ccfg, r.log.With("service", "guide-consumer"))

	for range opts.Gateways {
		r.startGateway()
	}
	r.warmUp()
	return r
}

// env is the settings every service shares, plus extra.
func (r *faultRig) env(extra map[string]string) config.Lookup {
	env := r.envMap(extra)
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// envMap is env as a map, for a process's environment.
func (r *faultRig) envMap(extra map[string]string) map[string]string {
	env := map[string]string{
		"STILLTHERE_REDIS_ADDRS":      r.redisAddrs(),
		"STILLTHERE_KEY_PREFIX":       r.prefix,
		"STILLTHERE_KAFKA_BROKERS":    r.brokers,
		"STILLTHERE_TOPIC":            r.topic,
		"STILLTHERE_TOPIC_PARTITIONS": "4",
		"STILLTHERE_TOKEN_SECRET":     r.tokenSecret,
		"STILLTHERE_PUSH_SECRET":      r.pushSecret,
		// One guide per silence: these tests are about the first stage.
		"STILLTHERE_CLOSE_AFTER": "0",
	}
	maps.Copy(env, extra)
	return env
}

// redisAddrs is how the listener and the consumer reach Redis.
func (r *faultRig) redisAddrs() string {
	if r.cluster != nil {
		return strings.Join(r.cluster.Addrs(), ",")
	}
	return r.redis.Addr
}

// client is a Redis client of the rig's own, closed at cleanup.
func (r *faultRig) client() redis.UniversalClient {
	var rdb redis.UniversalClient
	if r.cluster != nil {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: r.cluster.Addrs()})
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: r.redis.Addr})
	}
	r.t.Cleanup(func() { rdb.Close() })
	return rdb
}

func (r *faultRig) keyspace() session.Keyspace {
	ks, err := session.NewKeyspace(r.prefix)
	if err != nil {
		r.t.Fatal(err)
	}
	return ks
}

// startGateway starts a gateway instance with a name not used before,
// as a restarted process gets.
func (r *faultRig) startGateway() *rigGateway {
	t := r.t
	t.Helper()
	r.mu.Lock()
	r.started++
	g := &rigGateway{id: fmt.Sprintf("gw-%d", r.started)}
	r.mu.Unlock()
	addrs := r.redisAddrs()
	if r.redis != nil {
		g.back = startProxy(t, r.redis.Addr)
		addrs = g.back.Addr()
	}
	cfg, err := gateway.LoadConfig(nil, r.env(r.gatewayEnv(g.id, addrs)))
	if err != nil {
		t.Fatal(err)
	}
	// The clients' proxy starts before the gateway runs, so that it
	// closes after the gateway has stopped at cleanup.
	front := func(gw *gateway.Gateway) { g.front = startProxy(t, gw.PublicAddr().String()) }
	g.gw, g.svc = lifecycletest.Start(t, gateway.Open, cfg, r.log.With("service", "gateway", "instance", g.id), front)
	r.mu.Lock()
	r.gateways = append(r.gateways, g)
	r.mu.Unlock()
	r.log.Info("test: gateway up", "instance", g.id)
	return g
}

// gatewayEnv is the settings of gateway instance id, which reaches Redis
// at redisAddrs.
func (r *faultRig) gatewayEnv(id, redisAddrs string) map[string]string {
	env := map[string]string{
		"STILLTHERE_REDIS_ADDRS":        redisAddrs,
		"STILLTHERE_GATEWAY_ADDR":       "127.0.0.1:0",
		"STILLTHERE_PUSH_ADDR":          "127.0.0.1:0",
		"STILLTHERE_INSTANCE_ID":        id,
		"STILLTHERE_SESSION_TTL":        faultTTL.String(),
		"STILLTHERE_SESSION_JITTER":     faultJitter.String(),
		"STILLTHERE_HEARTBEAT_INTERVAL": heartbeatInterval.String(),
		"STILLTHERE_SHUTDOWN_TIMEOUT":   "2s",
	}
	if r.feed {
		maps.Copy(env, map[string]string{
			"STILLTHERE_ACTIVITY_FEED":             "true",
			"STILLTHERE_ACTIVITY_TOPIC_PARTITIONS": "4",
			"STILLTHERE_ACTIVITY_STAMP":            "100ms",
			"STILLTHERE_ACTIVITY_GAP":              "1s",
			// A member killed holds every deadline this long: the
			// shortest the brokers allow by default.
			"STILLTHERE_ACTIVITY_GROUP_SESSION_TIMEOUT": feedSessionTimeout.String(),
		})
	}
	return env
}

// feedSessionTimeout is the rig's activity group's session timeout.
const feedSessionTimeout = 6 * time.Second

// liveGateways are the instances clients may connect to.
func (r *faultRig) liveGateways() []*rigGateway {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*rigGateway(nil), r.gateways...)
}

// killGateways kills every gateway instance: clients' connections and
// its own to Redis are cut first, as a crash cuts them, so that its
// shutdown reaches neither (no close frame, no renewal flush, no Leave).
func (r *faultRig) killGateways() {
	r.mu.Lock()
	gws := r.gateways
	r.gateways = nil
	r.mu.Unlock()
	for _, g := range gws {
		g.back.Cut()
		g.front.Cut()
	}
	for _, g := range gws {
		g.svc.Tolerate()
		if err := g.svc.Stop(); err != nil {
			r.t.Logf("killed gateway %s: %v", g.id, err)
		}
	}
}

// warmUp waits until a timeout goes through the whole pipeline, so that
// the consumer has joined its group before a test times guides.
func (r *faultRig) warmUp() {
	r.t.Helper()
	store := session.NewStore(r.client(), r.keyspace())
	if _, err := store.Renew(context.Background(), "warm-up", session.DefaultSegment, 100*time.Millisecond, session.ClockPresence); err != nil {
		r.t.Fatal(err)
	}
	waitCond(r.t, 20*time.Second, "a guide through the pipeline", func() bool { return len(r.hook.Guides("warm-up")) > 0 })
}

// events reads the timeout events on the topic, by uid.
func (r *faultRig) events() map[string][]timeoutevent.Event {
	out := map[string][]timeoutevent.Event{}
	for _, ev := range topictest.Events(r.t, []string{r.brokers}, r.topic) {
		out[ev.UID] = append(out[ev.UID], ev)
	}
	return out
}

func startProxy(t *testing.T, target string) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// serviceLog collects the services' logs, and the test's own notes on
// them, and prints them if the test fails.
func serviceLog(t *testing.T) *slog.Logger {
	var (
		mu  sync.Mutex
		buf bytes.Buffer
	)
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	// Registered first, so it runs after every service has stopped.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		t.Logf("service logs:\n%s", buf.String())
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// mintFor signs a token for uid.
func mintFor(r *faultRig, uid string) string {
	tok, err := token.Mint([]byte(r.tokenSecret), uid, "", time.Hour)
	if err != nil {
		r.t.Fatal(err)
	}
	return tok
}
