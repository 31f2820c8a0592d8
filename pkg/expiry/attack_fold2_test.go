package expiry

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Second round of attack tests of the fold of a finding into the next
// entry of its item in the same emit (noteFound, findings).

// gateKey marks the context of the emit a test holds up (replayGate).
type gateKey struct{}

// replayGate holds up the pipelines run with gateKey's context while the
// spool has events in it: the first such pipeline starts the replayer,
// and each waits until the replayer has emptied the spool (or a few
// seconds). It stands for a Redis slower to answer step 6 (resolve the
// claims, settle) than Kafka is to take the replayed chunk.
type replayGate struct {
	l     *Listener
	once  sync.Once
	start func()
}

func (g *replayGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *replayGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (g *replayGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if ctx.Value(gateKey{}) != nil && g.l.spool.Len() > 0 {
			g.once.Do(g.start)
			eventually(5*time.Second, func() bool { return g.l.spool.Len() == 0 })
		}
		return next(ctx, cmds)
	}
}

// TestAttackFold2ReplayedBeforeItsLapse: while the spool is replayed (the
// topic just became known, or Kafka is back after an outage: new events
// are spooled behind the old ones), a silence is found and its event
// spooled. toSpool wakes the replayer at once, which produces it and
// records "replayed" while emit still resolves the claims and settles
// (step 6, two round trips to Redis). Only then does noteOutcome record
// "spooled", stamped time.Now() (not when it was spooled, as produced is
// stamped when sent), and the lapse is folded into it. The read unfolds
// it after the replayed entry of the same instance, and inOrder moves the
// lapse to the replay's time: the timeline says the silence's event was
// replayed before the silence was found. Before the fold the lapse was
// queued at step 1 and read first.
func TestAttackFold2ReplayedBeforeItsLapse(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	cfg := h.config(ModeEvents)
	cfg.PrefetchInterval = 0
	l := h.openIdle(cfg)
	// Not yet known to exist: emit spools, and the replayer, once it
	// runs, makes sure of the topic and replays.
	l.topicReady.Store(false)
	rctx, stopAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopAll(); wg.Wait() }()
	gate := &replayGate{l: l, start: func() {
		wg.Add(1)
		go func() { defer wg.Done(); l.replay(rctx) }()
	}}
	l.rdb.AddHook(gate)
	recCtx, stopRec := context.WithCancel(ctx)
	recorded := make(chan struct{})
	go func() { defer close(recorded); l.timeline.Run(recCtx) }()

	g := h.renew("user", "default", 200*time.Millisecond)
	var found []session.Expired
	waitFor(t, waitLong, "the deadline to pass", func() bool {
		var err error
		found, _, err = h.store.Due(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(found) == 1
	})
	c, err := l.marker.mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.emit(context.WithValue(ctx, gateKey{}, true), c, found, timeoutevent.SourceEvent); err != nil {
		t.Fatal(err)
	}
	h.waitProduced(1)
	stopRec()
	<-recorded

	es := h.timelineOf("user")
	logTimeline(t, es)
	got := steps(es)
	for _, e := range es {
		checkSilence(t, e, g)
	}
	lapse, replayed := slices.Index(got, "lapse"), slices.Index(got, "replayed")
	if lapse < 0 || replayed < 0 {
		t.Fatalf("timeline %q: want a lapse and a replayed entry", got)
	}
	if want := []string{"lapse", "spooled", "replayed"}; !slices.Equal(got, want) {
		t.Errorf("timeline %q, want %q: the lapse (at %v) reads after the replay of its own event (at %v); "+
			"the silence was found and spooled before the replayer took its event",
			got, want, es[lapse].At.Format("15:04:05.000"), es[replayed].At.Format("15:04:05.000"))
	}
}
