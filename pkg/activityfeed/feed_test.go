package activityfeed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// rig is an activity topic on the in-process Kafka, a real redis-server,
// and an Apply that records what it was given.
type rig struct {
	t       *testing.T
	brokers []string
	store   *session.Store

	mu      sync.Mutex
	applied []string // record values, in the order applied
	failing bool     // Apply returns an error
}

func newRig(t *testing.T) *rig {
	kc := kafkatest.StartFake(t)
	srv := redistest.Start(t)
	ks, err := session.NewKeyspace(redistest.Prefix(t))
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, brokers: kc.ListenAddrs(), store: session.NewStore(redistest.Client(t, srv), ks)}
}

func (r *rig) config() Config {
	k := kafka.DefaultConfig()
	k.Brokers, k.Topic, k.Partitions = r.brokers, DefaultTopic, 4
	return Config{Kafka: k, Stamp: 50 * time.Millisecond, Gap: time.Second}
}

// apply refuses records whose value starts with "bad", and fails while
// the rig says so.
func (r *rig) apply(_ context.Context, recs []*kgo.Record) (map[int]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing {
		return nil, errors.New("redis is down")
	}
	refused := map[int]string{}
	for i, rec := range recs {
		if strings.HasPrefix(string(rec.Value), "bad") {
			refused[i] = "bad record " + string(rec.Value)
			continue
		}
		r.applied = append(r.applied, string(rec.Value))
	}
	return refused, nil
}

func (r *rig) setFailing(v bool) {
	r.mu.Lock()
	r.failing = v
	r.mu.Unlock()
}

func (r *rig) appliedValues() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.applied)
}

// start runs a feed member until the test ends or stop is called.
func (r *rig) start() (stop func()) {
	r.t.Helper()
	f, err := Open(context.Background(), r.config(), r.store, Unprepared(r.apply), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			f.Close()
		})
	}
	r.t.Cleanup(stop)
	return stop
}

// produce writes values keyed by uid to the activity topic.
func (r *rig) produce(uid string, values ...string) {
	r.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers...), kgo.DefaultProduceTopic(DefaultTopic))
	if err != nil {
		r.t.Fatal(err)
	}
	defer cl.Close()
	for _, v := range values {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte(uid), Value: []byte(v)}).FirstErr(); err != nil {
			r.t.Fatal(err)
		}
	}
}

// control reads the control state as the listener does.
func (r *rig) control() session.Control {
	r.t.Helper()
	c, err := r.store.Mark(context.Background(), session.SweepMark{Keep: time.Hour, GapMax: time.Hour})
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// watermarkPast waits until every partition's watermark is at or past t.
func (r *rig) watermarkPast(t time.Time, within time.Duration) bool {
	return waitFor(within, func() bool {
		c := r.control()
		w, ok := c.ActivityWatermark()
		return ok && len(c.Activity) == 4 && !w.Before(t)
	})
}

func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // the poll's period
	}
}

// TestFeedAppliesInOrderAndStamps checks one member: each uid's records
// applied in order, refused ones dead-lettered with their reason, and the
// watermark past every record once they are applied.
func TestFeedAppliesInOrderAndStamps(t *testing.T) {
	r := newRig(t)
	r.start()
	for u := range 5 {
		uid := fmt.Sprintf("u%d", u)
		r.produce(uid, uid+"-1", "bad-"+uid, uid+"-2", uid+"-3")
	}
	produced := r.control().Now
	if !r.watermarkPast(produced, 30*time.Second) {
		t.Fatalf("watermark never passed the records' time: %v", r.control().Activity)
	}
	// Once the watermark is past them, every record is applied.
	got := r.appliedValues()
	if len(got) != 15 {
		t.Fatalf("applied %d records by the watermark, want 15: %v", len(got), got)
	}
	for u := range 5 {
		uid := fmt.Sprintf("u%d", u)
		var mine []string
		for _, v := range got {
			if strings.HasPrefix(v, uid+"-") {
				mine = append(mine, v)
			}
		}
		if want := []string{uid + "-1", uid + "-2", uid + "-3"}; !slices.Equal(mine, want) {
			t.Errorf("%s applied %v, want %v", uid, mine, want)
		}
	}
	dlq := readAll(t, r.brokers, DefaultTopic+"-dlq", 5)
	for _, rec := range dlq {
		if reason := header(rec, kafka.HeaderDLQReason); reason != "bad record "+string(rec.Value) {
			t.Errorf("dead letter %q has reason %q", rec.Value, reason)
		}
	}
	if c := r.control(); len(c.Blind) != 0 {
		t.Errorf("blind intervals %+v with a feed that kept up", c.Blind)
	}
}

// TestFeedDeadLettersABatch: a batch of thousands of refused records (a
// platform's release that writes a field wrong) goes to the dead-letter
// topic, each record once, in the order read, and the watermark passes
// them: they do not hold the partition one round trip each.
func TestFeedDeadLettersABatch(t *testing.T) {
	r := newRig(t)
	r.start()
	if !r.watermarkPast(r.control().Now, 30*time.Second) {
		t.Fatal("an idle feed never stamped") // nor made its topics
	}
	const users, each = 4, 500
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers...), kgo.DefaultProduceTopic(DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for u := range users {
		for i := range each {
			recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "u%d", u), Value: fmt.Appendf(nil, "bad-u%d-%04d", u, i)})
		}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	produced := r.control().Now
	if !r.watermarkPast(produced, 60*time.Second) {
		t.Fatalf("watermark never passed %d refused records: %v", len(recs), r.control().Activity)
	}
	dlq := readAll(t, r.brokers, DefaultTopic+"-dlq", len(recs))
	last := map[string]string{}
	seen := map[string]bool{}
	for _, rec := range dlq {
		v := string(rec.Value)
		if seen[v] {
			t.Errorf("%s dead-lettered twice", v)
		}
		seen[v] = true
		if reason := header(rec, kafka.HeaderDLQReason); reason != "bad record "+v {
			t.Errorf("dead letter %q has reason %q", v, reason)
		}
		if k := string(rec.Key); last[k] > v {
			t.Errorf("user %s: %s dead-lettered after %s, out of the order read", k, v, last[k])
		} else {
			last[k] = v
		}
	}
	if len(seen) != len(recs) {
		t.Fatalf("%d distinct dead letters, want %d", len(seen), len(recs))
	}
}

// TestFeedStallHoldsTheWatermark checks that while records cannot be
// applied the watermark stays before them, and that a stall past the gap
// is a blind interval once the feed catches up.
func TestFeedStallHoldsTheWatermark(t *testing.T) {
	r := newRig(t)
	r.start()
	if !r.watermarkPast(r.control().Now, 30*time.Second) {
		t.Fatal("an idle feed never stamped")
	}
	r.setFailing(true)
	r.produce("u1", "u1-1")
	stalled := r.control().Now
	if !waitFor(30*time.Second, func() bool { return r.control().Now.Sub(stalled) > 2*time.Second }) {
		t.Fatal("Redis's clock did not move")
	}
	held, _ := r.control().ActivityWatermark()
	if !held.Before(stalled) {
		t.Fatalf("watermark %v passed %v while its record could not be applied", held, stalled)
	}
	if lag := live.lag(); lag < 2 {
		t.Fatalf("lag gauge %.3fs while stalled for more than 2s", lag)
	}
	r.setFailing(false)
	recovered := r.control().Now
	if !r.watermarkPast(recovered, 30*time.Second) {
		t.Fatal("the watermark did not catch up")
	}
	if !waitFor(30*time.Second, func() bool { return live.lag() < 1 }) {
		t.Fatalf("lag gauge %.3fs after the feed caught up", live.lag())
	}
	if got := r.appliedValues(); !slices.Equal(got, []string{"u1-1"}) {
		t.Fatalf("applied %v, want the stalled record once", got)
	}
	// Over the stall from the watermark held; the other partitions may
	// have been stamped after the record, even after stalled, and have an
	// interval of their own from then (checkLagCover).
	checkLagCover(t, lagIntervals(r.control()), held, stalled, recovered)
}

// TestFeedRebalance checks two members sharing the partitions, one of
// which leaves in the middle: every record applied, at least once and in
// order per uid, and the watermark past them all.
func TestFeedRebalance(t *testing.T) {
	r := newRig(t)
	stopA := r.start()
	r.start()
	for u := range 20 {
		r.produce(fmt.Sprintf("u%d", u), fmt.Sprintf("u%d-1", u))
	}
	stopA()
	for u := range 20 {
		r.produce(fmt.Sprintf("u%d", u), fmt.Sprintf("u%d-2", u))
	}
	if !r.watermarkPast(r.control().Now, 30*time.Second) {
		t.Fatalf("watermark never passed the records: %v", r.control().Activity)
	}
	got := r.appliedValues()
	for u := range 20 {
		first := slices.Index(got, fmt.Sprintf("u%d-1", u))
		second := slices.Index(got, fmt.Sprintf("u%d-2", u))
		if first < 0 || second < 0 || second < first {
			t.Errorf("u%d: applied at %d and %d, want both, in order", u, first, second)
		}
	}
}

func readAll(t *testing.T, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(out), n, topic)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestFeedOpensWithKafkaDown: a gateway with the feed starts while Kafka
// is out of reach (its WebSockets do not wait for Kafka), and its feed
// stops when asked, having stamped nothing. It marked, before it reached
// Kafka, that a feed exists: the listener holds every deadline, as a
// record of the topic, unread, may renew any user.
func TestFeedOpensWithKafkaDown(t *testing.T) {
	srv := redistest.Start(t)
	ks, err := session.NewKeyspace(redistest.Prefix(t))
	if err != nil {
		t.Fatal(err)
	}
	store := session.NewStore(redistest.Client(t, srv), ks)
	k := kafka.DefaultConfig()
	k.Brokers, k.Topic = []string{"127.0.0.1:1"}, DefaultTopic
	apply := func(context.Context, []*kgo.Record) (map[int]string, error) { return nil, nil }
	f, err := Open(context.Background(), Config{Kafka: k}, store, Unprepared(apply), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("open with Kafka down: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	// It tries, and fails, to reach Kafka; then it is asked to stop.
	if !waitFor(30*time.Second, func() bool { _, failing := f.fetchOutage.Failing(); return failing }) {
		t.Fatal("the feed never found Kafka out of reach")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not stop")
	}
	f.Close()
	if _, parts, err := store.ActivityWatermarks(context.Background()); err != nil || len(parts) != 0 {
		t.Fatalf("watermark %v, %v; want none stamped", parts, err)
	}
	c, err := store.Mark(context.Background(), session.SweepMark{Keep: time.Hour, GapMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if w, fed := c.ActivityWatermark(); !fed || w.UnixMilli() != 0 {
		t.Fatalf("the listener's watermark = %v %v, want the epoch: a feed that never stamped holds every deadline", w, fed)
	}
}

// TestFeedPreparesWhileApplying: the feed prepares the next batch while
// the one before it applies, yet applies them one at a time, in order,
// and marks them all. Each batch's apply waits a while for the next
// one's prepare, which a feed that prepared only after applying never
// gives; one batch in a second is applied alone (the feed lets a
// rebalance in after it: rebalanceEvery), so at least one of them, not
// each, must see it.
func TestFeedPreparesWhileApplying(t *testing.T) {
	r := newRig(t)
	var want []string
	for i := range 60 {
		want = append(want, fmt.Sprintf("u-%03d", i))
	}

	var (
		mu         sync.Mutex
		prepared   int
		applied    []string
		busy       bool
		problems   []string
		overlapped int // applies that saw the next batch prepared
	)
	preparedCh := make([]chan struct{}, len(want)+2) // [n] closed once batch n is prepared
	for i := range preparedCh {
		preparedCh[i] = make(chan struct{})
	}
	prepare := func(recs []*kgo.Record) func(context.Context) (map[int]string, error) {
		mu.Lock()
		prepared++
		n := prepared
		if n < len(preparedCh) { // more batches than records: redelivered, and judged by applied
			close(preparedCh[n])
		}
		mu.Unlock()
		return func(ctx context.Context) (map[int]string, error) {
			mu.Lock()
			if busy {
				problems = append(problems, "two batches applied at once")
			}
			busy = true
			last := len(applied)+len(recs) == len(want)
			mu.Unlock()
			if !last && n+1 < len(preparedCh) {
				select {
				case <-preparedCh[n+1]:
					mu.Lock()
					overlapped++
					mu.Unlock()
				case <-time.After(3 * time.Second): // this batch was applied alone
				}
			}
			mu.Lock()
			defer mu.Unlock()
			busy = false
			for _, rec := range recs {
				applied = append(applied, string(rec.Value))
			}
			return nil, nil
		}
	}
	cfg := r.config()
	cfg.MaxBatch = 10
	f, err := Open(context.Background(), cfg, r.store, prepare, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	defer func() { cancel(); <-done; f.Close() }()
	r.produce("u", want...)
	produced := r.control().Now
	if !r.watermarkPast(produced, 60*time.Second) {
		t.Fatalf("watermark never passed the records' time: %v", r.control().Activity)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	if !slices.Equal(applied, want) {
		t.Fatalf("applied %v, want %v, in order", applied, want)
	}
	if overlapped == 0 {
		t.Fatalf("of %d batches, none saw the next prepared while it applied", prepared)
	}
	t.Logf("of %d batches, %d saw the next prepared while they applied", prepared, overlapped)
}

// TestFeedStallStampedElsewhereAfterItsRecord: the record that stalls is
// appended to partition 0, and the member stamps once more before its
// loop blocks on the batch it cannot apply: that stamp, at a time after
// the record, passes the other partitions but not partition 0. When the
// feed catches up, each partition that stepped by more than the gap
// records a blind interval from its own last stamp, so the other
// partitions' one begins after the record. The stall is still covered
// from the watermark held over it on (checkLagCover).
func TestFeedStallStampedElsewhereAfterItsRecord(t *testing.T) {
	r := newRig(t)
	// The batch of the record that stalls is prepared only once the test
	// has read the time after it and the next stamp is due: the member
	// stamps then, with that batch applying, and blocks on it after (at
	// its next poll, or at once were the rebalance it lets in between
	// batches due: rebalanceEvery, far longer than this wait).
	polled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	prepare := func(recs []*kgo.Record) func(context.Context) (map[int]string, error) {
		if slices.ContainsFunc(recs, func(rec *kgo.Record) bool { return string(rec.Value) == "u1-1" }) {
			once.Do(func() {
				close(polled)
				<-release
			})
		}
		return Unprepared(r.apply)(recs)
	}
	cfg := r.config()
	f, err := Open(context.Background(), cfg, r.store, prepare, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	defer func() { cancel(); <-done; f.Close() }()
	var released sync.Once
	letGo := func() { released.Do(func() { close(release) }) }
	defer letGo() // before the feed is stopped, should the test end early
	if !r.watermarkPast(r.control().Now, 30*time.Second) {
		t.Fatal("an idle feed never stamped")
	}
	r.setFailing(true)
	r.produceTo(0, "u1", "u1-1")
	select {
	case <-polled:
	case <-time.After(30 * time.Second):
		t.Fatal("the record was never polled")
	}
	polledAt := time.Now()
	stalled := r.control().Now
	// Redis's clock past stalled, and a stamp due (one since the last).
	if !waitFor(30*time.Second, func() bool { return r.control().Now.Sub(stalled) > cfg.Stamp }) {
		t.Fatal("Redis's clock did not move")
	}
	// The stamp after the record comes only if the loop lets no rebalance
	// in first, which it does a rebalanceEvery after the last (just
	// before the poll), waiting for the batch: a host that starved the
	// test that long broke the premise, and the test says so.
	slow := time.Since(polledAt) > rebalanceEvery-4*cfg.Stamp
	letGo()
	after := stalled.Add(time.Millisecond)
	if slow {
		t.Skipf("the batch was held %v, near rebalanceEvery (%v): the member may let a rebalance in before it stamps again, so the stamp after the record is not sure to come", time.Since(polledAt), rebalanceEvery)
	}
	if !r.stampedPast(after, 30*time.Second, 1, 2, 3) {
		t.Fatalf("partitions 1-3 never stamped past %v: %v", stalled, r.control().Activity)
	}
	if !waitFor(30*time.Second, func() bool { return r.control().Now.Sub(stalled) > 2*time.Second }) {
		t.Fatal("Redis's clock did not move")
	}
	c := r.control()
	held, _ := c.ActivityWatermark()
	if !held.Before(stalled) || !c.Activity[0].Equal(held) {
		t.Fatalf("watermark %v (partition 0 at %v) passed %v while its record could not be applied", held, c.Activity[0], stalled)
	}
	r.setFailing(false)
	recovered := r.control().Now
	if !r.watermarkPast(recovered, 30*time.Second) {
		t.Fatal("the watermark did not catch up")
	}
	lag := lagIntervals(r.control())
	checkLagCover(t, lag, held, stalled, recovered)
	// Both intervals are there: partition 0's from the watermark held, and
	// the other partitions' from their stamp after the record.
	if len(lag) != 2 || !slices.ContainsFunc(lag, func(b session.BlindInterval) bool { return b.Start.After(stalled) }) {
		t.Fatalf("activity-lag blind intervals %+v, want one from %v and one from after %v", lag, held, stalled)
	}
}

// lagIntervals is c's activity-lag blind intervals.
func lagIntervals(c session.Control) []session.BlindInterval {
	var lag []session.BlindInterval
	for _, b := range c.Blind {
		if b.Reason == session.BlindActivityLag {
			lag = append(lag, b)
		}
	}
	return lag
}

// checkLagCover checks the activity-lag blind intervals a stall left:
// held is the watermark read during it (the time of the partition whose
// record could not be applied, the earliest), stalled a time read after
// that record was appended, recovered when applying worked again.
//
// Each partition that stepped by more than the gap records an interval
// from its own last stamp (activity_caught_up.lua). The member may have
// stamped the other partitions after the record was appended, even after
// stalled, before its loop blocked on the batch it could not apply: their
// interval then starts after stalled. That is by design, not a hole:
// every record of theirs appended before that stamp had been applied,
// and a deadline between held and it lies in the stalled partition's own
// interval, from held, which the listener holds as it holds any other
// (expiry's outageHold checks each interval). So the promise is that the
// earliest interval starts at held, no later (a deadline just past the
// watermark of a user whose activity is stuck in the stall would be
// judged) and no earlier (nothing before held was unapplied), and that
// each lasts until recovered. One interval, or two when the other
// partitions were stamped after the record.
func checkLagCover(t *testing.T, lag []session.BlindInterval, held, stalled, recovered time.Time) {
	t.Helper()
	if len(lag) == 0 || len(lag) > 2 {
		t.Fatalf("activity-lag blind intervals %+v, want one from the watermark held %v (before %v) to %v", lag, held, stalled, recovered)
	}
	earliest := lag[0].Start
	for _, b := range lag {
		if b.Start.Before(held) || b.End.Before(recovered) {
			t.Fatalf("activity-lag blind interval %+v, want it from the watermark held %v or later, to %v or later", b, held, recovered)
		}
		if b.Start.Before(earliest) {
			earliest = b.Start
		}
	}
	if !earliest.Equal(held) {
		t.Fatalf("activity-lag blind intervals %+v, want one from the watermark held %v (before %v): a deadline after it was left to be judged", lag, held, stalled)
	}
}
