package activityfeed

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// startMember runs a feed member with cfg and returns it, to look at what
// it owns, and a stop that leaves the group.
func (r *rig) startMember(cfg Config) (*Feed, func()) {
	r.t.Helper()
	apply := func(ctx context.Context, recs []*kgo.Record) (map[int]string, error) {
		refused, err := r.apply(ctx, recs)
		if len(refused) > 0 {
			attack23BadSeen.Store(r, true)
		}
		return refused, err
	}
	f, err := Open(context.Background(), cfg, r.store, Unprepared(apply), slog.New(slog.NewTextHandler(attack23Log, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			f.Close()
		})
	}
	r.t.Cleanup(stop)
	return f, stop
}

// owns lists the partitions f tracks, sorted.
func (f *Feed) owns() []int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	ps := f.tr.owned()
	slices.Sort(ps)
	return ps
}

// produceTo writes a value keyed by uid to partition p of the topic.
func (r *rig) produceTo(p int32, uid, value string) {
	r.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers...), kgo.DefaultProduceTopic(DefaultTopic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		r.t.Fatal(err)
	}
	defer cl.Close()
	rec := &kgo.Record{Key: []byte(uid), Value: []byte(value), Partition: p}
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		r.t.Fatal(err)
	}
}

// watermarkOf waits until each of parts has been stamped at or past t.
func (r *rig) stampedPast(t time.Time, within time.Duration, parts ...int32) bool {
	return waitFor(within, func() bool {
		c := r.control()
		for _, p := range parts {
			if w, ok := c.Activity[p]; !ok || w.Before(t) {
				return false
			}
		}
		return true
	})
}

// TestAttack23NewPartitionIgnored: the platform's operators add a
// partition to the activity topic (the documented way to scale the
// consumer group). The platform's producers see it at once and write a
// user's `active` to it; our members see it only at their next metadata
// refresh (minutes by default). Meanwhile the record sits unread, and the
// watermark, the earliest of the partitions in the hash, knows nothing of
// the new partition: it runs on with partition 0, and the listener
// judges the user's deadline as if every activity had been applied. The
// promise broken: a user kept active through the topic is guided (a
// silence our feed caused).
func TestAttack23NewPartitionIgnored(t *testing.T) {
	r := startStamped(t)

	adm := kadm.NewClient(newPlainClient(t, r.brokers))
	if _, err := adm.CreatePartitions(context.Background(), 1, DefaultTopic); err != nil {
		t.Fatal(err)
	}
	before, err := r.store.ActivityClock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r.produceTo(1, "u1", "active-on-the-new-partition")
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		w, fed := r.control().ActivityWatermark()
		if slices.Contains(r.appliedValues(), "active-on-the-new-partition") {
			return // applied before the watermark passed it: held, as promised
		}
		if fed && w.After(before.Add(time.Second)) {
			t.Fatalf("watermark %v past the record's time by %v while the record on the new partition is unapplied: a deadline in between is judged (partitions in the hash: %v)",
				w, w.Sub(before), r.control().Activity)
		}
		// Watched for 10 s of real time: the feed must run meanwhile.
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAttack23ReturnedEmptyPartitionStuck: a member gets back, in a
// rebalance, a partition with no committed offset and no records (a quiet
// partition: few users hash to it). Its position is unknown until a
// record comes, and stampOnce looks its start up only when the member has
// more unknown partitions than committed ones: one unknown against one
// committed is not, so it is never stamped again. Its old stamp (from
// the member that left) stays in the hash, and the watermark, the
// earliest, stops there for good: every deadline after it is held again
// and again. The promise broken: a silent user is never guided, though
// every record of every partition has been applied.
func TestAttack23ReturnedEmptyPartitionStuck(t *testing.T) {
	r := newRig(t)
	cfg := r.config()
	cfg.Kafka.Partitions = 2
	a, _ := r.startMember(cfg)
	t0, err := r.store.ActivityClock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.stampedPast(t0, 10*time.Second, 0, 1) {
		t.Fatal("partitions never stamped")
	}
	b, stopB := r.startMember(cfg)
	if !waitFor(20*time.Second, func() bool { return len(a.owns()) == 1 && len(b.owns()) == 1 }) {
		t.Fatalf("no rebalance: a owns %v, b %v", a.owns(), b.owns())
	}
	pa, pb := a.owns()[0], b.owns()[0]
	// A user of a's partition is active: a applies it and commits.
	r.produceTo(pa, "u1", "active-a")
	if !waitFor(10*time.Second, func() bool {
		_, ok := a.cl.CommittedOffsets()[DefaultTopic][pa]
		return ok
	}) {
		t.Fatal("a never committed its partition")
	}
	t1, err := r.store.ActivityClock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.stampedPast(t1, 10*time.Second, pb) {
		t.Fatal("b never stamped its partition")
	}
	stopB()
	if !waitFor(20*time.Second, func() bool { return len(a.owns()) == 2 }) {
		t.Fatalf("a never got b's partition back: owns %v", a.owns())
	}
	t2, err := r.store.ActivityClock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.stampedPast(t2, 10*time.Second, pa, pb) {
		c := r.control()
		w, _ := c.ActivityWatermark()
		t.Fatalf("watermark stuck %v behind Redis's clock, all records applied (partitions %v, a's was %d, b's %d): every deadline since is held, no silent user guided",
			c.Now.Sub(w), c.Activity, pa, pb)
	}
}

func newPlainClient(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestAttack23OversizedBadRecordStopsFeed: a record that does not parse
// and is near the size limit of a produce (the platform's producer and
// ours share Kafka's default of about 1 MB). Its dead letter is the same
// value with headers added (reason, topic, partition, offset): too large
// to produce. applyBatch retries the dead letter until it succeeds,
// which it never does, so the feed stops on this record: the records
// behind it are never applied, and the watermark stops. The promise
// broken: a bad record goes to the dead-letter topic and the rest flow
// on; here every user fed through the topic is held, none guided, for
// good.
func TestAttack23OversizedBadRecordStopsFeed(t *testing.T) {
	r := newRig(t)
	cfg := r.config()
	cfg.Kafka.Partitions = 1
	r.startMember(cfg)
	// The largest value the platform's producer (kgo's defaults) takes.
	big := []byte("bad")
	big = append(big, make([]byte, 1_000_012-200)...)
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers...), kgo.DefaultProduceTopic(DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range big[3:] {
		big[3+i] = 'x'
	}
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte("u1"), Value: big}).FirstErr(); err != nil {
		t.Fatalf("the platform's producer refused it: %v", err)
	}
	// Once the feed has handed the bad record to Apply (and so tries to
	// dead-letter it), a good record.
	if !waitFor(15*time.Second, func() bool { _, ok := attack23BadSeen.Load(r); return ok }) {
		t.Fatal("the bad record never reached Apply")
	}
	r.produce("u2", "active-after-the-bad-one")
	if !waitFor(15*time.Second, func() bool { return slices.Contains(r.appliedValues(), "active-after-the-bad-one") }) {
		t.Fatal("the record after an oversized bad one was never applied: the feed stopped on its dead letter")
	}
}

var attack23Log io.Writer = io.Discard

// attack23BadSeen holds the rigs whose Apply was handed a record it refuses.
var attack23BadSeen sync.Map

// TestAttack23TopicChangeStuck: the operator moves the feed to another
// activity topic (STILLTHERE_ACTIVITY_TOPIC), one with fewer partitions,
// or recreates the topic smaller. The watermark is keyed by partition
// number alone, not by topic, and nothing ever drops a partition from it:
// the old topic's partitions 2 and 3 keep their last stamps, and the
// watermark, the earliest, stops there. The promise broken: every
// deadline since is held again and again, no silent user is guided, though
// the new topic is applied to its end.
func TestAttack23TopicChangeStuck(t *testing.T) {
	r := newRig(t)
	old := r.config()
	old.Kafka.Partitions = 4
	_, stop := r.startMember(old)
	t0, err := r.store.ActivityClock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.stampedPast(t0, 10*time.Second, 0, 1, 2, 3) {
		t.Fatal("the old topic's partitions never stamped")
	}
	stop()
	moved := r.config()
	moved.Kafka.Topic, moved.Kafka.Partitions = "session-activity-v2", 2
	r.startMember(moved)
	t1, err := r.store.ActivityClock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.stampedPast(t1, 10*time.Second, 0, 1) {
		t.Fatal("the new topic's partitions never stamped")
	}
	if !waitFor(10*time.Second, func() bool {
		w, _ := r.control().ActivityWatermark()
		return !w.Before(t1)
	}) {
		c := r.control()
		w, _ := c.ActivityWatermark()
		t.Fatalf("watermark stuck %v behind Redis's clock after the move to a topic of 2 partitions, every one of them applied (stamps %v): no deadline since is judged",
			c.Now.Sub(w), c.Activity)
	}
}
