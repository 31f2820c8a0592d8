package timeline

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
)

// Attack tests of the fold (Entry.Found): one stored entry that stands
// for two decisions.

// TestAttackFoldDroppedCountsOneOfTwo: a folded entry Redis refuses is two
// decisions lost, and stillthere_timeline_entries_total counted two of it
// (the finding and the outcome); stillthere_timeline_dropped_total counts
// one. Read against each other, the two counters now say half of what was
// lost was recorded: an operator who sees entries - dropped trusts
// timelines that lack every lapse of the outage.
func TestAttackFoldDroppedCountsOneOfTwo(t *testing.T) {
	const svc = "attackfold-refused"
	ks, err := session.NewKeyspace("attackfold")
	if err != nil {
		t.Fatal(err)
	}
	// Redis out of reach: nothing listens on the port.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	r := NewRecorder(session.NewStore(rdb, ks), Config{Service: svc, Instance: "l-1"})

	counted := func() float64 {
		return testutil.ToFloat64(metricEntries.WithLabelValues(svc, string(KindLapse), "")) +
			testutil.ToFloat64(metricEntries.WithLabelValues(svc, string(KindProduced), ""))
	}
	dropped := func() float64 { return testutil.ToFloat64(metricDropped.WithLabelValues(svc)) }

	counted0, dropped0 := counted(), dropped()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	now := time.Now()
	r.RecordAt("ann", Fold(Entry{Kind: KindProduced, Event: "e-1", Stage: 1}, KindLapse, now.Add(-20*time.Millisecond), now), now)
	cancel()
	<-done

	c, d := counted()-counted0, dropped()-dropped0
	if c != 2 {
		t.Fatalf("entries counted %v, want 2: the lapse and the produced", c)
	}
	if d != c {
		t.Errorf("entries_total counted %v decisions (a lapse and its event), Redis refused them all, and dropped_total counts %v: "+
			"a folded entry lost is counted as one entry, though it stood for two", c, d)
	}
}

// TestAttackFoldQueueFullCountsOneOfTwo: with the recorder's queue full
// (Redis slow), a folded entry is dropped as one, though it is a lapse and
// its outcome: dropped_total counts one decision lost where two were.
func TestAttackFoldQueueFullCountsOneOfTwo(t *testing.T) {
	const svc = "attackfold-full"
	ks, err := session.NewKeyspace("attackfold")
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	// Not run: nothing takes from the queue.
	r := NewRecorder(session.NewStore(rdb, ks), Config{Service: svc, Instance: "l-1"})
	for range defaultQueue {
		r.Record("bob", Entry{Kind: KindSent})
	}
	before := testutil.ToFloat64(metricDropped.WithLabelValues(svc))
	now := time.Now()
	r.RecordAt("ann", Fold(Entry{Kind: KindHeld, Rule: "blind", Stage: 1}, KindLapse, now.Add(-5*time.Millisecond), now), now)
	if d := testutil.ToFloat64(metricDropped.WithLabelValues(svc)) - before; d != 2 {
		t.Errorf("a lapse and its hold dropped at a full queue: dropped_total grew by %v, want 2 (entries_total would have counted 2)", d)
	}
}
