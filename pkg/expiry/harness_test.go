package expiry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/timeoutevent/topictest"
)

const (
	testTopic = "session-timeouts"
	// waitLong bounds every wait for something the listener does. It is
	// far above the usual second so that a slow CI machine does not fail.
	waitLong = 20 * time.Second
)

// harness is one test's own redis-server and embedded Kafka, with the
// session store the gateway would write through: its renewals record a
// hold they cancel in the user's timeline, as a gateway's do with the
// timeline on (the default).
type harness struct {
	t       *testing.T
	srv     *redisserver.Server  // nil on a cluster
	cluster *redisserver.Cluster // nil on a single node
	rdb     redis.UniversalClient
	store   *session.Store
	kafka   *kfake.Cluster
	prefix  string
	admin   *kadm.Client
	// logs are the logs of the services the test runs (listeners,
	// gateways): printed if the test fails, or as they come with -v.
	logs *syncBuffer
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	srv := redistest.Start(t)
	h := newHarnessOn(t, redistest.Client(t, srv))
	h.srv = srv
	return h
}

// newClusterHarness runs the harness on a 3-master Redis Cluster, each
// master with a replica when replicas is set.
func newClusterHarness(t *testing.T, replicas bool) *harness {
	t.Helper()
	c := redistest.StartCluster(t)
	if replicas {
		if err := c.AddReplicas(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { rdb.Close() })
	h := newHarnessOn(t, rdb)
	h.cluster = c
	return h
}

func newHarnessOn(t *testing.T, rdb redis.UniversalClient) *harness {
	t.Helper()
	// Registered first, so run last: after every service has stopped.
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() && logs.String() != "" {
			t.Logf("service logs:\n%s", logs.String())
		}
	})
	prefix := redistest.Prefix(t)
	ks, err := session.NewKeyspace(prefix)
	if err != nil {
		t.Fatal(err)
	}
	cluster := startKafka(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &harness{
		t:      t,
		rdb:    rdb,
		store:  session.NewStore(rdb, ks).WithHoldNotes(timeline.Settings{}.HoldNotes("gateway", "")),
		kafka:  cluster,
		prefix: prefix,
		admin:  kadm.NewClient(cl),
		logs:   logs,
	}
}

// startKafka runs an embedded one-broker Kafka for the test: the one way
// the tests start one.
func startKafka(t *testing.T) *kfake.Cluster {
	t.Helper()
	return kafkatest.StartFake(t)
}

// config is a valid listener config for the harness, quick to react:
// TestConfig on the harness's Redis and Kafka, in mode.
func (h *harness) config(mode string) Config {
	rc := redisconn.Config{KeyPrefix: h.prefix}
	if h.cluster != nil {
		rc.Addrs, rc.Cluster = h.cluster.Addrs(), true
	} else {
		rc.Addrs = []string{h.srv.Addr}
	}
	cfg := TestConfig(rc, h.kafka.ListenAddrs(), h.t.TempDir())
	cfg.Kafka.Topic = testTopic
	cfg.Mode = mode
	return cfg
}

// testGrace is the outage grace of the tests: short, as their TTLs are.
const testGrace = TestGrace

// releaseSlack is how long past its grace a held timeout may be produced
// in these tests: enough to tell a brake or hold that lets go from one
// that does not, on a host whose cores others starve (a storm of
// thousands released together took 3.4 s past grace + 2 s beside two CPU
// hogs). How soon it lets go is measured where timing is, in the
// benchmark (bench/report.md, step 4: the storm).
const releaseSlack = 10 * time.Second

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// logger is a logger of the test's services, named by service: into
// h.logs, printed if the test fails (see newHarnessOn), or to stderr
// with -v.
func (h *harness) logger(service string) *slog.Logger {
	if testing.Verbose() {
		return testLogger().With("service", service)
	}
	return slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelInfo})).With("service", service)
}

// start opens a listener and runs it. The returned stop closes it: Close
// stops Run and waits for it; cleanup calls it too.
func (h *harness) start(cfg Config) (stop func()) {
	h.t.Helper()
	_, stop = h.startListener(cfg)
	return stop
}

// startListener is start, returning the listener for a test to look into.
func (h *harness) startListener(cfg Config) (l *Listener, stop func()) {
	h.t.Helper()
	return h.startListenerLogging(cfg, h.logger("expiry-listener"))
}

// startListenerLogging is startListener with the logger given: the one
// way the tests run a listener in process, through lifecycletest as the
// other packages' tests do.
func (h *harness) startListenerLogging(cfg Config, logger *slog.Logger) (l *Listener, stop func()) {
	t := h.t
	t.Helper()
	l, run := lifecycletest.Start(t, Open, cfg, logger)
	return l, func() {
		if err := run.Stop(); err != nil {
			t.Error(err)
		}
	}
}

// eventually polls cond until it holds or within has passed, and reports
// whether it held. It is the package's one way of waiting: tests wait for
// what they need to be true, never for a fixed time that assumes a fast
// machine.
func eventually(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // the poll interval, not a wait for anything
	}
	return true
}

// waitFor is eventually, failing the test if cond does not hold within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !eventually(within, cond) {
		t.Fatalf("gave up after %v waiting for %s", within, what)
	}
}

// untilRedis waits until Redis's clock reaches at: real time must pass
// for a deadline, a hold or a lease to run out, and Redis's clock is the
// one they run out by.
func (h *harness) untilRedis(at time.Time) {
	h.t.Helper()
	within := waitLong + max(0, time.Until(at))
	waitFor(h.t, within, "Redis's clock to reach "+at.Format(time.RFC3339Nano), func() bool {
		return !h.redisNow().Before(at)
	})
}

// probes numbers the sweep probes of a test process.
var probes atomic.Int64

// sweptPast waits until a listener has finished a sweep that ran at or
// after Redis's time at: whatever that sweep could produce or hold is on
// the topic, in the spool or in Redis by then. It is how a test checks
// that nothing more comes, without guessing how long a sweep takes on a
// busy machine. A listener whose sweeps pause (a full spool, a standby
// replica) never gets past it.
//
// It watches two probes: held timeouts of sessions still live, which a
// sweep (or an events-mode release) puts back into the index once their
// release time came and lists as nothing due. The first is released at
// at; the second once the first is back in the index, so that the sweep
// which took the first, and the batch it found with it, are done: one
// pipeline goroutine sweeps and produces in turn.
func (h *harness) sweptPast(at time.Time) {
	h.t.Helper()
	h.probe(at)
	h.probe(time.Time{})
}

// probe puts a probe in the hold set, released at release, and waits
// until a sweep has put it back into the index; then removes it.
func (h *harness) probe(release time.Time) {
	h.t.Helper()
	ctx := context.Background()
	ks := h.store.Keyspace()
	uid := fmt.Sprintf("sweep-probe-%d", probes.Add(1))
	b := session.Bucket(uid)
	// Live for an hour, far past any test: never due, never expired.
	deadline := h.redisNow().Add(time.Hour).UnixMilli()
	for _, err := range []error{
		h.rdb.Set(ctx, ks.SessionKey(uid), "default", time.Hour).Err(),
		h.rdb.HSet(ctx, ks.HeldKey(b), uid, deadline).Err(),
		h.rdb.ZAdd(ctx, ks.HoldKey(b), redis.Z{Score: float64(release.UnixMilli()), Member: uid}).Err(),
	} {
		if err != nil {
			h.t.Fatal(err)
		}
	}
	within := waitLong + max(0, time.Until(release))
	waitFor(h.t, within, "a sweep past "+release.Format(time.RFC3339Nano), func() bool { return h.inIndex(uid) })
	for _, err := range []error{
		h.rdb.ZRem(ctx, ks.IndexKey(b), uid).Err(),
		h.rdb.ZRem(ctx, ks.HoldKey(b), uid).Err(),
		h.rdb.HDel(ctx, ks.HeldKey(b), uid).Err(),
		h.rdb.Del(ctx, ks.SessionKey(uid)).Err(),
	} {
		if err != nil {
			h.t.Fatal(err)
		}
	}
}

// waitSubscribed waits until n clients hold a pattern subscription on
// every master: only then are expired events heard.
func (h *harness) waitSubscribed(n int) {
	h.t.Helper()
	addrs := []string{}
	if h.cluster != nil {
		addrs = h.cluster.Addrs()
	} else {
		addrs = append(addrs, h.srv.Addr)
	}
	for _, addr := range addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		waitFor(h.t, waitLong, "keyspace event subscriptions on "+addr, func() bool {
			list, err := node.ClientList(context.Background()).Result()
			if err != nil {
				h.t.Fatal(err)
			}
			return strings.Count(list, " psub=1 ") >= n
		})
		node.Close()
	}
}

// grant is what the gateway granted a uid.
type grant struct {
	segment  string
	deadline time.Time
}

func (h *harness) renew(uid, segment string, ttl time.Duration) grant {
	h.t.Helper()
	deadline, err := h.store.Renew(context.Background(), uid, segment, ttl, session.ClockPresence)
	if err != nil {
		h.t.Fatal(err)
	}
	return grant{segment: segment, deadline: deadline}
}

// produced is how many records the topic holds; 0 before it exists.
func (h *harness) produced() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ends, err := h.admin.ListEndOffsets(ctx, testTopic)
	if err != nil {
		return 0
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			n += o.Offset
		}
	})
	return n
}

// waitProduced waits until the topic holds at least n records.
func (h *harness) waitProduced(n int) {
	h.t.Helper()
	var got int64
	if !eventually(waitLong, func() bool { got = h.produced(); return got >= int64(n) }) {
		h.t.Fatalf("topic holds %d events after %v, want %d", got, waitLong, n)
	}
}

// inIndex reports whether uid has a deadline-index entry.
func (h *harness) inIndex(uid string) bool {
	h.t.Helper()
	return h.member(h.store.Keyspace().IndexKey(session.Bucket(uid)), uid)
}

// inHold reports whether uid has an entry in its bucket's hold set: its
// timeout held by the listener.
func (h *harness) inHold(uid string) bool {
	h.t.Helper()
	return h.member(h.store.Keyspace().HoldKey(session.Bucket(uid)), uid)
}

// member reports whether the sorted set key holds uid.
func (h *harness) member(key, uid string) bool {
	h.t.Helper()
	_, err := h.rdb.ZScore(context.Background(), key, uid).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		h.t.Fatal(err)
	}
	return err == nil
}

// waitSettled waits until none of uids has an index entry and the sweep
// finds nothing due.
func (h *harness) waitSettled(uids []string) {
	h.t.Helper()
	waitFor(h.t, waitLong, "index entries of produced timeouts to be removed", func() bool {
		for _, uid := range uids {
			if h.inIndex(uid) {
				return false
			}
		}
		return true
	})
	due, _, err := h.store.Due(context.Background(), 1000)
	if err != nil {
		h.t.Fatal(err)
	}
	if len(due) != 0 {
		h.t.Fatalf("Due after settling = %+v, want none", due)
	}
}

// events reads every timeout event on the topic.
func (h *harness) events() []timeoutevent.Event {
	h.t.Helper()
	return topictest.Events(h.t, h.kafka.ListenAddrs(), testTopic)
}

// byUID groups events by uid.
func byUID(evs []timeoutevent.Event) map[string][]timeoutevent.Event {
	m := make(map[string][]timeoutevent.Event)
	for _, ev := range evs {
		m[ev.UID] = append(m[ev.UID], ev)
	}
	return m
}

// checkEvent checks that ev reports the silence of g.
func checkEvent(t *testing.T, ev timeoutevent.Event, g grant, sources ...string) {
	t.Helper()
	ms := g.deadline.UnixMilli()
	switch {
	case ev.DeadlineMS != ms:
		t.Errorf("event for %s: deadline %d, want %d", ev.UID, ev.DeadlineMS, ms)
	case ev.ID != timeoutevent.ID(ev.UID, ms):
		t.Errorf("event for %s: id %s, want %s", ev.UID, ev.ID, timeoutevent.ID(ev.UID, ms))
	case ev.Segment != g.segment:
		t.Errorf("event for %s: segment %q, want %q", ev.UID, ev.Segment, g.segment)
	case ev.DetectedMS < ev.DeadlineMS:
		t.Errorf("event for %s: detected at %d, before its deadline %d", ev.UID, ev.DetectedMS, ev.DeadlineMS)
	case ev.Version != timeoutevent.Version:
		t.Errorf("event for %s: version %d", ev.UID, ev.Version)
	}
	for _, s := range sources {
		if ev.Source == s {
			return
		}
	}
	t.Errorf("event for %s: source %q, want one of %q", ev.UID, ev.Source, sources)
}

// checkExactlyOnce checks that evs hold one event for each uid of want and
// nothing else.
func checkExactlyOnce(t *testing.T, evs []timeoutevent.Event, want map[string]grant, sources ...string) {
	t.Helper()
	got := byUID(evs)
	for uid, g := range want {
		switch n := len(got[uid]); n {
		case 0:
			t.Errorf("no event for %s", uid)
		case 1:
			checkEvent(t, got[uid][0], g, sources...)
		default:
			t.Errorf("%d events for %s, want one: %+v", n, uid, got[uid])
		}
	}
	for uid, evs := range got {
		if _, ok := want[uid]; !ok {
			t.Errorf("event for %s, which never went silent: %+v", uid, evs)
		}
	}
}
