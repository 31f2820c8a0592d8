package activityfeed

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// txnClient is a platform's transactional producer on partition 0.
func (r *rig) txnClient(id string) *kgo.Client {
	r.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers...), kgo.DefaultProduceTopic(DefaultTopic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionalID(id))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(cl.Close)
	return cl
}

// TestAttackFXOpenTransactionThenAbort: a transaction left open on a
// partition, and behind it a record of another, non-transactional
// producer (an active the gateway's own producer, or a second platform
// service, wrote). Read committed, the feed cannot read past the open
// transaction: the record behind it is not applied, and the watermark
// must not pass the time it was written, however long the transaction
// stays open. Once the transaction is aborted, the record behind it is
// applied, the aborted one never is, and the watermark passes the abort
// (its marker counted applied). Guards both edges: no checkpoint passed
// with a record unapplied, and no stall after the abort.
func TestAttackFXOpenTransactionThenAbort(t *testing.T) {
	r := newRig(t)
	cfg := r.config()
	cfg.Kafka.Partitions = 1
	r.startMember(cfg)
	ctx := context.Background()
	t0, err := r.store.ActivityClock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !r.stampedPast(t0, 10*time.Second, 0) {
		t.Fatal("partition 0 never stamped")
	}

	txn := r.txnClient("platform-open")
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := txn.ProduceSync(ctx, &kgo.Record{Key: []byte("u1"), Value: []byte("open-then-aborted"), Partition: 0}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	r.produceTo(0, "u2", "active-behind-open")
	behind, err := r.store.ActivityClock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// While the transaction is open, for a good many stamps (50ms each):
	// the watermark passes the record behind it only once it is applied.
	// Real time must pass here: the property is that nothing happens.
	until := time.Now().Add(2 * time.Second)
	for time.Now().Before(until) {
		w, ok := r.control().Activity[0]
		applied := slices.Contains(r.appliedValues(), "active-behind-open")
		if ok && !w.Before(behind) && !applied {
			t.Fatalf("the watermark passed %v (at %v) while the record written before then, behind an open transaction, was not applied: "+
				"a user that record renews is judged silent", behind, w)
		}
		// Real time must pass: the guard watches the watermark over the
		// whole window, polling it.
		time.Sleep(20 * time.Millisecond)
	}

	if err := txn.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	aborted, err := r.store.ActivityClock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool { return slices.Contains(r.appliedValues(), "active-behind-open") }) {
		t.Fatalf("the record behind the aborted transaction was never applied: %v", r.appliedValues())
	}
	if !r.stampedPast(aborted, 10*time.Second, 0) {
		c := r.control()
		t.Fatalf("the watermark stalled after the transaction was aborted (stamps %v, Redis now %v): every deadline since is held", c.Activity, c.Now)
	}
	if got := r.appliedValues(); slices.Contains(got, "open-then-aborted") {
		t.Fatalf("an aborted transaction's record was applied: %v", got)
	}
}

// TestAttackFXRefusedAmongMarkers: one poll brings data records and
// transaction markers mixed, some of the data refused by Apply. The
// refused indexes count data records only: exactly the refused records
// go to the dead-letter topic, the others are applied, and the watermark
// passes them all.
func TestAttackFXRefusedAmongMarkers(t *testing.T) {
	r := newRig(t)
	cfg := r.config()
	cfg.Kafka.Partitions = 1
	ctx := context.Background()

	// A first member makes the topics, then leaves; the records are
	// written while none reads, so that one poll can bring them all:
	// [good-1, bad-1, commit], bad-2, [good-2, bad-3, commit], good-3.
	_, stop := r.startMember(cfg)
	t0, err := r.store.ActivityClock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !r.stampedPast(t0, 10*time.Second, 0) {
		t.Fatal("partition 0 never stamped")
	}
	stop()
	txn := r.txnClient("platform-mixed")
	tx := func(values ...string) {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			if err := txn.ProduceSync(ctx, &kgo.Record{Key: []byte("u1"), Value: []byte(v), Partition: 0}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	tx("good-1", "bad-1")
	r.produceTo(0, "u1", "bad-2")
	tx("good-2", "bad-3")
	r.produceTo(0, "u1", "good-3")
	written, err := r.store.ActivityClock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	r.startMember(cfg)
	if !r.stampedPast(written, 10*time.Second, 0) {
		c := r.control()
		t.Fatalf("the watermark never passed the records (stamps %v, applied %v)", c.Activity, r.appliedValues())
	}
	if got := r.appliedValues(); !slices.Equal(got, []string{"good-1", "good-2", "good-3"}) {
		t.Fatalf("applied %v, want good-1, good-2, good-3", got)
	}
	var dead []string
	for _, rec := range readAll(t, r.brokers, cfg.Kafka.Topic+"-dlq", 3) {
		if !rec.Attrs.IsControl() {
			dead = append(dead, string(rec.Value))
		}
	}
	slices.Sort(dead)
	if !slices.Equal(dead, []string{"bad-1", "bad-2", "bad-3"}) {
		t.Fatalf("dead-lettered %v, want exactly the refused bad-1, bad-2, bad-3: a refused index mapped onto the wrong record", dead)
	}
}
