package timeline

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stillthere/stillthere/pkg/session"
)

// Second round of attack tests of the fold (Entry.Found) and of what
// AppendTimeline says Redis took.

// TestAttackFold2PartialScriptCountsStoredAsDropped: AppendTimeline says
// of a bucket's records that none was taken when its script fails, but a
// Lua script that fails part way keeps what it wrote before: the records
// of the bucket appended before the failing one are in Redis. Here a
// user's timeline key holds a string (WRONGTYPE for RPUSH); the user
// before them in the same bucket gets a lapse folded into its produced,
// which Redis stores and Read shows, and dropped_total counts it as two
// decisions lost: three dropped where one was.
func TestAttackFold2PartialScriptCountsStoredAsDropped(t *testing.T) {
	const svc = "attackfold2-partial"
	store, rdb := newStore(t)
	ctx := context.Background()
	ann := "ann"
	other := ""
	for i := 0; other == ""; i++ {
		if u := fmt.Sprintf("u%d", i); session.Bucket(u) == session.Bucket(ann) {
			other = u
		}
	}
	if err := rdb.Set(ctx, store.Keyspace().TimelineKey(other), "not a list", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r := NewRecorder(store, Config{Service: svc, Instance: "l-1"})
	dropped := func() float64 { return testutil.ToFloat64(metricDropped.WithLabelValues(svc)) }
	before := dropped()
	now := time.Now()
	r.RecordAt(ann, Fold(Entry{Kind: KindProduced, Event: "e-1", Stage: 1}, KindLapse, now.Add(-20*time.Millisecond), now), now)
	r.RecordAt(other, Entry{Kind: KindLapse, Stage: 1}, now)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(rctx); close(done) }()
	cancel()
	<-done

	es, err := Read(ctx, store, ann, 0)
	if err != nil {
		t.Fatal(err)
	}
	if Kinds(es) != "lapse: produced:" {
		t.Fatalf("ann's timeline %q, want the lapse and its produced (stored before the script failed)", Kinds(es))
	}
	if d := dropped() - before; d != 1 {
		t.Errorf("dropped_total grew by %v, want 1 (the other user's lapse): ann's lapse and produced are in Redis, read back as %q, "+
			"yet counted lost, as AppendTimeline says nothing of their bucket was taken", d, Kinds(es))
	}
}
