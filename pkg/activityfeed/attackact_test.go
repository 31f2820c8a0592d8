package activityfeed

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestAttackActRebalanceWhilePreparing: two members, records flowing,
// each batch prepared while the one before it applies; a second member
// joins and the first leaves mid-flow. A partition must pass from one
// member to the other between batches: were a batch prepared before the
// revoke applied after it, the old owner would apply a user's older
// event after the new owner applied a newer one, and the older one
// (an active after the end, say) would bring back a session the user
// closed, or a turn already answered. Per partition, the members apply
// in one hand-over (the old, then the new, never back), and each member
// applies its offsets in order, none twice.
func TestAttackActRebalanceWhilePreparing(t *testing.T) {
	r := newRig(t)
	type applied struct {
		member    string
		partition int32
		offset    int64
	}
	var (
		mu  sync.Mutex
		log []applied
	)
	start := func(member string) (stop func()) {
		prepare := func(recs []*kgo.Record) func(context.Context) (map[int]string, error) {
			return func(ctx context.Context) (map[int]string, error) {
				// A slow apply, so that the next batch is polled and
				// prepared while it runs, and a rebalance is due then.
				time.Sleep(5 * time.Millisecond)
				mu.Lock()
				defer mu.Unlock()
				for _, rec := range recs {
					log = append(log, applied{member, rec.Partition, rec.Offset})
				}
				return nil, nil
			}
		}
		cfg := r.config()
		cfg.MaxBatch = 3
		f, err := Open(context.Background(), cfg, r.store, prepare, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); f.Run(ctx) }()
		var once sync.Once
		stop = func() { once.Do(func() { cancel(); <-done; f.Close() }) }
		t.Cleanup(stop)
		return stop
	}
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			uid := fmt.Sprintf("u%02d", i%24)
			r.produce(uid, fmt.Sprintf("%s-%d", uid, i))
		}
	}
	stopA := start("a")
	produce(0, 80)
	start("b")
	produce(80, 160)
	stopA()
	produce(160, 240)
	if !r.watermarkPast(r.control().Now, 60*time.Second) {
		t.Fatalf("watermark never passed the records: %v", r.control().Activity)
	}
	mu.Lock()
	defer mu.Unlock()
	type key struct {
		member    string
		partition int32
	}
	last := map[key]int64{}
	owner := map[int32]string{}
	handed := map[int32]bool{}
	seen := map[int32]map[int64]bool{}
	for _, a := range log {
		k := key{a.member, a.partition}
		if prev, ok := last[k]; ok && a.offset <= prev {
			t.Errorf("%s applied partition %d offset %d after %d", a.member, a.partition, a.offset, prev)
		}
		last[k] = a.offset
		if o, ok := owner[a.partition]; ok && o != a.member {
			if handed[a.partition] {
				t.Errorf("partition %d went back to %s at offset %d: two members applied it at once", a.partition, a.member, a.offset)
			}
			handed[a.partition] = true
		}
		owner[a.partition] = a.member
		if seen[a.partition] == nil {
			seen[a.partition] = map[int64]bool{}
		}
		seen[a.partition][a.offset] = true
	}
	if len(handed) == 0 {
		t.Errorf("no partition passed from one member to the other: the test saw no rebalance")
	}
	n := 0
	for _, offs := range seen {
		n += len(offs)
	}
	if n != 240 {
		t.Errorf("applied %d distinct records, want 240", n)
	}
}
