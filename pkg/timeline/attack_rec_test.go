package timeline

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
)

// recHarness runs one Recorder over its own redis-server, with a service
// label of its own so that its dropped count is its alone.
type recHarness struct {
	t      *testing.T
	store  *session.Store
	rdb    *redis.Client
	r      *Recorder
	svc    string
	cancel context.CancelFunc
	done   chan struct{}
	drop0  float64
}

// recUsers spreads entries over users, so that no timeline's bound trims
// one of them away.
const recUsers = 64

func recUID(i int) string { return "u" + strconv.Itoa(i%recUsers) }

func startRecHarness(t *testing.T, svc string) *recHarness {
	t.Helper()
	store, rdb := newStore(t)
	h := &recHarness{t: t, store: store, rdb: rdb, svc: svc, done: make(chan struct{})}
	h.r = NewRecorder(store, Config{Service: svc, Instance: "i-1",
		Bounds: session.TimelineBounds{Entries: 2 * defaultQueue, Keep: time.Hour}})
	h.drop0 = testutil.ToFloat64(metricDropped.WithLabelValues(svc))
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.r.Run(ctx); close(h.done) }()
	t.Cleanup(func() {
		h.unpause()
		cancel()
		select {
		case <-h.done:
		case <-time.After(30 * time.Second): // a bound on a hang, not a pace
			t.Error("Run did not return")
		}
	})
	return h
}

// pause makes Redis hold every write (the timeline's scripts included)
// until unpause; reads (LLEN) still answer.
func (h *recHarness) pause() {
	h.t.Helper()
	if err := h.rdb.Do(context.Background(), "CLIENT", "PAUSE", 20000, "WRITE").Err(); err != nil {
		h.t.Fatal(err)
	}
}

func (h *recHarness) unpause() {
	h.rdb.Do(context.Background(), "CLIENT", "UNPAUSE")
}

// waitHeld waits until Redis holds a client's command: Run's send.
func (h *recHarness) waitHeld() {
	h.t.Helper()
	pollUntil(h.t, "Redis to hold Run's send", func() bool {
		s, err := h.rdb.Info(context.Background(), "clients").Result()
		if err != nil {
			h.t.Fatal(err)
		}
		return !strings.Contains(s, "blocked_clients:0\r")
	})
}

// waitTaken waits until Run has taken entries, so that at most below
// wait: it takes a batch at a time, and sends each before the next.
func (h *recHarness) waitTaken(below int) {
	h.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); h.r.q.waiting() > below; {
		if time.Now().After(deadline) {
			h.t.Fatalf("waited 10s for Run to take entries: %d wait, want at most %d", h.r.q.waiting(), below)
		}
		runtime.Gosched() // no sleep: the next step must follow the take closely
	}
}

func (h *recHarness) stopped() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

func (h *recHarness) waitStopped() {
	h.t.Helper()
	select {
	case <-h.done:
	case <-time.After(30 * time.Second): // a bound on a hang, not a pace
		h.t.Fatal("Run did not return")
	}
}

// stored counts the entries in Redis, over every user.
func (h *recHarness) stored(uids ...string) int {
	h.t.Helper()
	if len(uids) == 0 {
		for u := range recUsers {
			uids = append(uids, recUID(u))
		}
	}
	n := 0
	for _, uid := range uids {
		l, err := h.rdb.LLen(context.Background(), h.store.Keyspace().TimelineKey(uid)).Result()
		if err != nil {
			h.t.Fatal(err)
		}
		n += int(l)
	}
	return n
}

func (h *recHarness) dropped() int {
	return int(testutil.ToFloat64(metricDropped.WithLabelValues(h.svc)) - h.drop0)
}

// fillWhileHeld has Run hold one entry in a send Redis holds, and
// queues n more behind it: they all wait, none taken yet.
func (h *recHarness) fillWhileHeld(n int) {
	h.t.Helper()
	h.pause()
	h.r.Record(recUID(0), Entry{Kind: KindStart, Conns: -1})
	h.waitHeld() // Run sends it at its tick, and Redis holds that
	for i := range n {
		h.r.Record(recUID(i), Entry{Kind: KindStart, Conns: i})
	}
}

// TestAttackRecStopMidTakeDropsTheRest: a stop that comes while Run sends
// a storm's worth of entries, a batch at a time, leaves the rest to the
// stop's drain, which sends them with its own context: every one reaches
// Redis (up all along). Before, Run took all that waited at one wake and
// sent the rest of it with the stopped context, which failed at once:
// every batch not yet sent was dropped.
func TestAttackRecStopMidTakeDropsTheRest(t *testing.T) {
	h := startRecHarness(t, "attack-rec-stop-mid-take")
	const n = 4 * defaultBatch // a few batches: the drain's second is ample
	h.fillWhileHeld(n)
	h.unpause()
	h.waitTaken(n - defaultBatch) // at a wake, its context live
	h.cancel()
	h.waitStopped()
	if got, want := h.stored(), n+1; got != want {
		t.Fatalf("%d of %d entries reached Redis (up all along), %d counted dropped: "+
			"the stop came while Run sent what it took at one wake, and it sent the rest with the stopped context",
			got, want, h.dropped())
	}
}

// TestAttackRecDrainLosesWhatIsRecordedWhileItSends: the stop's drain
// takes until nothing waits, entries recorded while it sends its batches
// (batches of 512, each a trip to Redis) included: every entry recorded
// while Run runs reaches Redis or is counted as dropped. Before, the
// drain took what waited once, and those recorded meanwhile were
// neither sent nor counted.
func TestAttackRecDrainLosesWhatIsRecordedWhileItSends(t *testing.T) {
	for attempt := range 3 {
		h := startRecHarness(t, fmt.Sprintf("attack-rec-drain-%d", attempt))
		const n = 4 * defaultBatch // a few batches: the drain's second is ample
		h.fillWhileHeld(n)
		// At the stop Run's select has both the wake token and ctx.Done
		// ready and picks either; taking the token makes it pick the
		// stop, as it does in half of all runs.
		select {
		case <-h.r.wake:
		default:
		}
		h.cancel()
		h.unpause()
		h.waitTaken(n - 1) // the drain took a batch, and sends it
		h.pause()          // Redis holds the drain's next batch, if any is left
		const late = 10
		for i := range late {
			h.r.Record("late", Entry{Kind: KindEnd, Conns: i})
		}
		if h.stopped() {
			h.unpause()
			continue // the drain had sent all before the late entries: try again
		}
		h.unpause()
		h.waitStopped()
		stored, dropped := h.stored()+h.stored("late"), h.dropped()
		if want := n + 1 + late; stored+dropped != want {
			t.Fatalf("recorded %d entries while Run ran (the last %d while its drain sent), "+
				"%d reached Redis and %d were counted dropped: %d lost, uncounted (late ones in Redis: %d)",
				want, late, stored, dropped, want-stored-dropped, h.stored("late"))
		}
		return
	}
	t.Log("inconclusive: each time the drain sent all before the late entries were recorded")
}

// TestAttackRecStallHoldsTwiceTheQueue: with Redis stalled, at most
// defaultQueue entries wait beside the batch Redis holds; the rest are
// dropped and counted. Before, Record bounded only what waited untaken,
// and what Run had taken at one wake and not yet sent (up to defaultQueue
// more) was beside it: twice the bound, at the peak of a stall.
func TestAttackRecStallHoldsTwiceTheQueue(t *testing.T) {
	h := startRecHarness(t, "attack-rec-bound")
	const n = defaultQueue - 1
	h.fillWhileHeld(n)
	h.unpause()
	h.waitTaken(n - 1) // Run took a batch, and sends it
	h.pause()          // Redis stalls again: it holds Run's send
	const more = 2 * defaultQueue
	for i := range more {
		h.r.Record(recUID(i), Entry{Kind: KindEnd, Conns: i})
	}
	if h.stopped() {
		t.Fatal("Run returned")
	}
	sent := h.stored() // applied before the stall; LLEN answers under a write pause
	waiting := 1 + n + more - h.dropped() - sent
	if bound := defaultQueue + defaultBatch; waiting > bound {
		t.Fatalf("with Redis stalled %d entries wait, not dropped (%d sent before the stall, %d dropped); "+
			"want at most %d (the queue, and the batch being sent)", waiting, sent, h.dropped(), bound)
	}
}
