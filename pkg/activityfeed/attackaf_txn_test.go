package activityfeed

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestAttackAFTransactionalProducerStopsWatermark: the platform writes
// the activity topic with a transactional producer (Kafka Streams with
// exactly-once, or any producer that sets a transactional id). Each
// transaction ends with a commit marker: a control record that takes an
// offset of its own, so the partition's end is one past the marker. The
// consumer skips the marker and never hands it to Apply; the tracker
// counts a partition applied only up to the last record it was handed
// (or the offset committed for it, which is the same), one short of the
// end. No checkpoint taken after the transaction is ever passed, and the
// partition's watermark stops at the time of the last stamp before it.
// The promise broken: every deadline after that time is held again and
// again, fleet-wide, and no silent user is ever guided, though every
// record of the topic has been applied.
func TestAttackAFTransactionalProducerStopsWatermark(t *testing.T) {
	r := startStamped(t)
	ctx := context.Background()
	produceInTransaction(t, r, "active-in-a-transaction", kgo.TryCommit)
	committed, err := r.store.ActivityClock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool { return slices.Contains(r.appliedValues(), "active-in-a-transaction") }) {
		t.Fatal("the transaction's record was never applied")
	}
	// Every record is applied: the watermark must pass the commit within
	// a few stamps (50ms each here); 10s is generous.
	if !r.stampedPast(committed, 10*time.Second, 0) {
		c := r.control()
		w, _ := c.ActivityWatermark()
		t.Fatalf("watermark stuck %v behind Redis's clock after a committed transaction whose record was applied (stamps %v): every deadline since is held, no silent user guided",
			c.Now.Sub(w), c.Activity)
	}
}

// TestAttackAFAbortedTransactionApplied: the platform's transactional
// producer writes an event and aborts the transaction (the chat message
// it reported was rolled back: the platform says it never happened).
// The feed's client reads uncommitted records (kgo's default isolation
// level; nothing in Open asks for read-committed), so the aborted record
// is handed to Apply with the committed ones and applied: an `end` the
// platform took back ends a conversation and cancels its stages, an
// `active` renews a user who was silent. The promise broken: the guide
// of a silence is lost (or delayed a TTL) on an event the platform never
// committed.
func TestAttackAFAbortedTransactionApplied(t *testing.T) {
	r := startStamped(t)
	produceInTransaction(t, r, "end-rolled-back", kgo.TryAbort)
	// A committed record after it: once it is applied, the feed has read
	// past the aborted one.
	r.produce("u1", "active-after")
	if !waitFor(10*time.Second, func() bool { return slices.Contains(r.appliedValues(), "active-after") }) {
		t.Fatal("the record after the aborted transaction was never applied")
	}
	if got := r.appliedValues(); slices.Contains(got, "end-rolled-back") {
		t.Fatalf("a record of an aborted transaction was applied: %v", got)
	}
}

// startStamped starts a member of a one-partition feed and waits until it
// stamped its partition.
func startStamped(t *testing.T) *rig {
	t.Helper()
	r := newRig(t)
	cfg := r.config()
	cfg.Kafka.Partitions = 1
	r.startMember(cfg)
	t0, err := r.store.ActivityClock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.stampedPast(t0, 10*time.Second, 0) {
		t.Fatal("partition 0 never stamped")
	}
	return r
}

// produceInTransaction writes value to the topic in a transaction of the
// platform's transactional producer, ended by end (commit or abort).
func produceInTransaction(t *testing.T, r *rig, value string, end kgo.TransactionEndTry) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers...), kgo.DefaultProduceTopic(DefaultTopic),
		kgo.TransactionalID("platform-activity"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("u1"), Value: []byte(value)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, end); err != nil {
		t.Fatal(err)
	}
}
