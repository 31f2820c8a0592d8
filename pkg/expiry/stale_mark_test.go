package expiry

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttackProducedMarkDuringSlotMigration: the bucket of a silent user
// starts to migrate to another master while the listener produces the
// user's timeout, as a reshard may at any moment. The listener's mark of
// its dedup key must land (a script of that key alone, which a moving
// slot serves; one of two keys is answered TRYAGAIN for as long as the
// slot moves). The settle fails (the slot is moving). Had the mark been
// lost, the next sweep, once the slot has moved, would find the entry
// again, meet its own claim, which claim.lua answers fresh, and produce
// the timeout a second time. With the mark, the claim answers done and
// the entry is settled with one event.
//
// The second event is the same id, which the push endpoint dedupes; but
// the consumer checks the session again for it, and a user who came back
// after the first guide makes it stale: the window is then marked stale
// and another silence of the user in the same minute is guided at once,
// two guides in one minute. Where the settle does land (the slot done
// between the two), the claim stays instead until it lapses, and a
// second silence in the minute is guided at that lapse, before the
// window ends (session's TestProducedMarkDuringSlotMigration).
func TestAttackProducedMarkDuringSlotMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	h := newClusterHarness(t, false)
	ctx := context.Background()
	ks := h.store.Keyspace()
	const uid = "mig-mark"
	slot, err := h.cluster.SlotOf(ctx, ks.IndexKey(session.Bucket(uid)))
	if err != nil {
		t.Fatal(err)
	}
	from, err := h.cluster.SlotOwner(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	to := (from + 1) % len(h.cluster.Masters)

	// The slot starts to migrate when the listener's produce reaches the
	// broker: after the claim, before the mark.
	migrations := make(chan *redisserver.Migration, 1)
	var once sync.Once
	h.kafka.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		once.Do(func() {
			m, err := h.cluster.BeginMigration(context.Background(), slot, to)
			if err != nil {
				t.Errorf("begin migration: %v", err)
				close(migrations)
				return
			}
			migrations <- m
		})
		return nil, nil, false
	})

	var logs syncBuffer
	_, stop := h.startListenerLogging(h.config(ModeSweep), slog.New(slog.NewTextHandler(&logs, nil)))
	defer stop()
	g := h.renew(uid, "default", 500*time.Millisecond)

	m, ok := <-migrations
	if !ok {
		t.Fatal("no migration")
	}
	h.waitProduced(1)
	// The listener has recorded its batch: its dedup key marked, or the
	// mark's failure logged.
	dd := ks.StageDedupKey(uid, 1, g.deadline)
	waitFor(t, waitLong, "the listener to record its batch", func() bool {
		v, _ := h.rdb.Get(ctx, dd).Result()
		return strings.Contains(logs.String(), "record dedup outcome") || strings.HasPrefix(v, "produced:")
	})
	if i := strings.Index(logs.String(), "record dedup outcome"); i >= 0 {
		line := logs.String()[i:]
		if j := strings.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		t.Logf("listener: %s", line)
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	// The slot has moved: the next sweeps settle what is left.
	waitFor(t, waitLong, "the entry settled", func() bool { return !h.inIndex(uid) })
	h.sweptPast(h.redisNow())
	stop()
	evs := byUID(h.events())[uid]
	if len(evs) != 1 {
		t.Fatalf("%d events for %s's one silence (deadline %d), want 1: the mark lost while the slot migrated, "+
			"the listener's own claim was fresh to it again: %+v", len(evs), uid, g.deadline.UnixMilli(), evs)
	}
}
