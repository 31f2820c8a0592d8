package guide

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/lifecycle"
	"github.com/stillthere/stillthere/pkg/push/pushtest"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

const (
	testTopic      = "session-timeouts"
	testPartitions = 4
	testSecret     = "test-push-secret-0123456789abcdef"
	testText       = "Are you still there?"

	// waitLong bounds every wait on the group: a rebalance on the embedded
	// broker takes a heartbeat interval or two (3s each by default).
	waitLong = 20 * time.Second
)

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// waitFor polls cond until it holds, failing the test after waitLong.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !holdsWithin(waitLong, cond) {
		t.Fatalf("waited %v for %s", waitLong, what)
	}
}

// holdsWithin is waitFor for a caller with more to say when cond did
// not hold: it polls cond for up to d and reports whether it held.
func holdsWithin(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// checkShownOnce fails unless every event's user was shown exactly one
// guide, with the configured text, and no push came without the secret.
func (e *testEnv) checkShownOnce(t *testing.T, evs []produced) {
	t.Helper()
	for _, p := range evs {
		if !e.gw.Shown(p.ev.ID) {
			t.Errorf("guide %s for %s never shown", p.ev.ID, p.ev.UID)
		}
		if n := e.gw.ShownTo(p.ev.UID); n != 1 {
			t.Errorf("user %s shown %d guides, want 1", p.ev.UID, n)
		}
	}
	if n := e.gw.Unauthorized(); n != 0 {
		t.Errorf("%d pushes came without the bearer secret", n)
	}
	for _, text := range e.gw.Texts() {
		if text != testText {
			t.Errorf("guide text %q, want %q", text, testText)
		}
	}
}

// testEnv is one test's world: its own redis-server, embedded Kafka with
// the timeout topic, and the gateway's push endpoint as a recorder.
type testEnv struct {
	t     *testing.T
	env   map[string]string // the settings cfg was loaded from
	cfg   Config            // the consumer's config, pointed at this env
	rdb   *redis.Client
	store *session.Store
	gw    *pushtest.Recorder
	gwURL string // where the consumer pushes: gw's push.Path
	prod  *kgo.Client
	adm   *kadm.Client
	log   *slog.Logger // what start gives consumers; testLogger() if nil

	mu  sync.Mutex
	seq int64 // makes every produced event's deadline, and so its id, unique
}

func newEnv(t *testing.T) *testEnv {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redistest.Client(t, srv)
	prefix := redistest.Prefix(t)

	cluster := kafkatest.StartFake(t, kfake.SeedTopics(testPartitions, testTopic))
	brokers := cluster.ListenAddrs()

	// Records go to the partition the test picks; the key is still the
	// uid, as the listener writes it.
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	gw, gwURL := pushtest.Start(t, testSecret)

	env := map[string]string{
		"STILLTHERE_REDIS_ADDRS":         srv.Addr,
		"STILLTHERE_KEY_PREFIX":          prefix,
		"STILLTHERE_KAFKA_BROKERS":       strings.Join(brokers, ","),
		"STILLTHERE_TOPIC":               testTopic,
		"STILLTHERE_TOPIC_PARTITIONS":    fmt.Sprint(testPartitions),
		"STILLTHERE_CONSUMER_ADMIN_ADDR": "127.0.0.1:0",
		"STILLTHERE_CONSUMER_GROUP":      "guide-test",
		"STILLTHERE_PUSH_URL":            gwURL,
		"STILLTHERE_PUSH_SECRET":         testSecret,
		"STILLTHERE_SEND_TIMEOUT":        "200ms",
		"STILLTHERE_BREAKER_FAILURES":    "3",
		"STILLTHERE_BREAKER_TIMEOUT":     "300ms",
		// The embedded broker's least: a killed member's partitions
		// move this soon.
		"STILLTHERE_GROUP_SESSION_TIMEOUT": "6s",
	}
	cfg, err := LoadConfig(nil, mapLookup(env))
	if err != nil {
		t.Fatalf("load config: %v", err)
	}
	return &testEnv{
		t:     t,
		env:   env,
		cfg:   cfg,
		rdb:   rdb,
		store: session.NewStore(rdb, cfg.Redis.Keyspace()),
		gw:    gw,
		gwURL: gwURL,
		prod:  prod,
		adm:   kadm.NewClient(prod),
	}
}

func mapLookup(env map[string]string) config.Lookup {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// produced is a timeout event as written to the topic.
type produced struct {
	ev        timeoutevent.Event
	partition int32
	offset    int64
}

func partitionOf(uid string) int32 {
	h := fnv.New32a()
	h.Write([]byte(uid))
	return int32(h.Sum32() % testPartitions)
}

// produce writes one timeout event per uid, each to the partition its uid
// hashes to, and waits for the broker's acks.
func (e *testEnv) produce(uids ...string) []produced {
	e.t.Helper()
	out := make([]produced, 0, len(uids))
	for _, uid := range uids {
		out = append(out, e.produceTo(partitionOf(uid), uid))
	}
	return out
}

// produceTo writes a timeout event for uid to partition p.
func (e *testEnv) produceTo(p int32, uid string) produced {
	e.t.Helper()
	e.mu.Lock()
	e.seq++
	deadline := time.Now().Add(-time.Second).Truncate(time.Millisecond).Add(time.Duration(e.seq) * time.Millisecond)
	e.mu.Unlock()
	ev := timeoutevent.New(uid, session.DefaultSegment, deadline, deadline.Add(50*time.Millisecond), timeoutevent.SourceSweep)
	b, err := ev.Marshal()
	if err != nil {
		e.t.Fatal(err)
	}
	return produced{ev: ev, partition: p, offset: e.produceRaw(p, uid, b)}
}

// produceRaw writes value as is to partition p and returns its offset.
func (e *testEnv) produceRaw(p int32, key string, value []byte) int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &kgo.Record{Topic: testTopic, Partition: p, Key: []byte(key), Value: value}
	if err := e.prod.ProduceSync(ctx, r).FirstErr(); err != nil {
		e.t.Fatalf("produce to partition %d: %v", p, err)
	}
	return r.Offset
}

// committed returns the group's committed offsets by partition; a partition
// with no commit is absent, and so is a group that never joined.
func (e *testEnv) committed(group string) map[int32]int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := e.adm.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return nil // not joined yet: nothing committed
	}
	if err != nil {
		e.t.Fatalf("fetch offsets of %s: %v", group, err)
	}
	out := make(map[int32]int64)
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.Topic == testTopic && o.At >= 0 {
			out[o.Partition] = o.At
		}
	})
	return out
}

// ends returns the topic's end offsets of partitions that have records.
func (e *testEnv) ends() map[int32]int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	listed, err := e.adm.ListEndOffsets(ctx, testTopic)
	if err != nil {
		e.t.Fatalf("list end offsets: %v", err)
	}
	out := make(map[int32]int64)
	listed.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			out[o.Partition] = o.Offset
		}
	})
	return out
}

// waitCommittedToEnd waits until group has committed every record on the
// topic.
func (e *testEnv) waitCommittedToEnd(group string) {
	e.t.Helper()
	ends := e.ends()
	var got map[int32]int64
	if !holdsWithin(waitLong, func() bool {
		got = e.committed(group)
		for p, end := range ends {
			if got[p] < end {
				return false
			}
		}
		return true
	}) {
		e.t.Fatalf("group %s committed %v, topic ends at %v", group, got, ends)
	}
}

// waitShown waits until every event's guide was delivered to the gateway.
func (e *testEnv) waitShown(evs []produced) {
	e.t.Helper()
	waitFor(e.t, fmt.Sprintf("%d guides to be shown", len(evs)), func() bool {
		for _, p := range evs {
			if !e.gw.Shown(p.ev.ID) {
				return false
			}
		}
		return true
	})
}

// groupMembers returns the number of members of a stable group, and how
// many partitions each was assigned; 0 while the group is rebalancing.
func (e *testEnv) groupMembers(group string) (int, []int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gs, err := e.adm.DescribeGroups(ctx, group)
	if err != nil {
		e.t.Fatalf("describe group %s: %v", group, err)
	}
	g, ok := gs[group]
	if !ok || g.Err != nil || g.State != "Stable" {
		return 0, nil
	}
	var parts []int
	for _, m := range g.Members {
		n := 0
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range c.Topics {
				n += len(tp.Partitions)
			}
		}
		parts = append(parts, n)
	}
	slices.Sort(parts)
	return len(g.Members), parts
}

// running is a consumer running in the background.
type running struct {
	t    *testing.T
	c    *Consumer
	done chan error // Run's error, once it returned
	once sync.Once
}

// start opens a consumer with cfg and runs it until the test ends or stop.
// Each prepare func sees the consumer before it runs.
func (e *testEnv) start(cfg Config, prepare ...func(*Consumer)) *running {
	e.t.Helper()
	logger := e.log
	if logger == nil {
		logger = testLogger()
	}
	c, err := Open(context.Background(), cfg, logger)
	if err != nil {
		e.t.Fatalf("open consumer: %v", err)
	}
	c.lagEvery = 100 * time.Millisecond
	for _, f := range prepare {
		f(c)
	}
	r := &running{t: e.t, c: c, done: make(chan error, 1)}
	go func() { r.done <- c.Run(context.Background()) }()
	e.t.Cleanup(r.stop)
	return r
}

// stop closes the consumer: Close stops Run, waits for it and leaves the
// group.
func (r *running) stop() {
	r.once.Do(func() {
		closed := make(chan struct{})
		go func() {
			r.c.Close()
			close(closed)
		}()
		select {
		case <-closed:
			// A Run that had not begun when Close came returns
			// ErrClosed: closed without running, a stop too.
			if err := <-r.done; err != nil && !errors.Is(err, lifecycle.ErrClosed) {
				r.t.Errorf("consumer stopped with: %v", err)
			}
		case <-time.After(waitLong):
			r.t.Errorf("consumer did not stop within %v", waitLong)
		}
	})
}

func uids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	return out
}

// gathered finds the metric called name whose labels include the given
// name, value pairs in the default registry, as /metrics serves it; nil
// when there is none.
func gathered(t *testing.T, name string, labels ...string) *dto.Metric {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := make(map[string]string)
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

// metricValue reads a counter or gauge; labels are name, value pairs.
// Missing reads as 0.
func metricValue(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	m := gathered(t, name, labels...)
	switch {
	case m == nil:
		return 0
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func guidesSettled(t *testing.T, outcome Outcome) float64 {
	return metricValue(t, "stillthere_consumer_guides_total", "outcome", string(outcome))
}

func sendErrors(t *testing.T) float64 {
	return metricValue(t, "stillthere_consumer_send_errors_total")
}

func breakerGauge(t *testing.T) float64 {
	return metricValue(t, "stillthere_consumer_breaker_state", "downstream", "gateway")
}

// paused returns the partitions of the timeout topic the consumer's client
// does not fetch, sorted.
func (r *running) paused() []int32 {
	ps := r.c.client.PauseFetchPartitions(nil)[testTopic]
	slices.Sort(ps)
	return ps
}

// dlqRecord is a record read back from the dead-letter topic.
type dlqRecord struct {
	key, value string
	headers    map[string]string
}

// deadLetters reads the dead-letter topic from its start until it holds
// want records, failing the test after waitLong.
func (e *testEnv) deadLetters(want int) []dlqRecord {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.cfg.Kafka.Brokers...), kgo.ConsumeTopics(e.cfg.DLQTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	var out []dlqRecord
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			e.t.Fatalf("read %d of %d dead letters: %v", len(out), want, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			d := dlqRecord{key: string(r.Key), value: string(r.Value), headers: make(map[string]string)}
			for _, h := range r.Headers {
				d.headers[h.Key] = string(h.Value)
			}
			out = append(out, d)
		})
	}
	return out
}

// deadLettered counts the records on the dead-letter topic.
func (e *testEnv) deadLettered() int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	listed, err := e.adm.ListEndOffsets(ctx, e.cfg.DLQTopic)
	if err != nil {
		e.t.Fatalf("list end offsets of %s: %v", e.cfg.DLQTopic, err)
	}
	var n int64
	listed.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			e.t.Fatalf("end offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		n += o.Offset
	})
	return n
}

func breakerOpens(t *testing.T) float64 {
	return metricValue(t, "stillthere_consumer_breaker_changes_total", "downstream", "gateway", "to", "open")
}
