package expiry

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attack tests of the fold of a finding into the next entry of its item
// in the same emit (timeline.Entry.Found, noteFound).

// TestAttackFoldLapseHiddenWhileKafkaWaits: a lapse is found and its
// event goes to a Kafka that does not answer (the produce-timeout is the
// default's 10 s). Support, asked "why was nobody nudged?", reads the
// user's timeline while it waits: the lapse was found seconds ago, and the
// timeline says nothing of it. Before the fold it was recorded within a
// flush of its finding; now it waits in the emit, for up to the
// produce-timeout, and a listener that dies there (SIGKILL, OOM, a node
// lost) takes it with it: the timeline never shows the silence was found.
func TestAttackFoldLapseHiddenWhileKafkaWaits(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	inProduce := make(chan time.Time, 1)
	answer := make(chan struct{})
	var once sync.Once
	h.kafka.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		first := false
		once.Do(func() { first = true })
		if first {
			inProduce <- time.Now()
			h.kafka.SleepControl(func() { <-answer })
		}
		return nil, nil, false
	})
	var release sync.Once
	answerNow := func() { release.Do(func() { close(answer) }) }
	defer answerNow()

	cfg := h.config(ModeHybrid)
	cfg.ProduceTimeout = DefaultConfig().ProduceTimeout
	stop := h.start(cfg)
	defer stop()
	h.renew("user", "default", 300*time.Millisecond)

	var at time.Time
	select {
	case at = <-inProduce:
	case <-time.After(waitLong):
		t.Fatal("the timeout never reached Kafka")
	}
	// Found before its produce began: a finding waits at most a second to
	// be folded; 6s leaves a starved machine room, under the 10s the
	// produce waits.
	shown := eventually(6*time.Second, func() bool {
		return slices.Contains(steps(h.timelineOf("user")), "lapse")
	})
	got := steps(h.timelineOf("user"))
	answerNow()
	if !shown {
		t.Errorf("%v after the lapse was found and its event went to Kafka, which has not answered, the timeline is %q: "+
			"the lapse is not in it, and a listener that died now would never record it", time.Since(at).Round(100*time.Millisecond), got)
	}
	h.waitProduced(1)
	h.waitTimeline("user", "lapse", "produced")
}

// TestAttackFoldTwiceInBatchReadsFoundAfterHeld: a batch from expired
// events lists a uid twice (judgeFound: "a batch from expired events can
// list a uid twice") during a blind interval: both are judged held by the
// outage rule, the first is held (HoldEach holds a uid listed twice once),
// the second is not. Both were found at once, before the hold. Before the
// fold the timeline read "lapse lapse held:blind"; now the second finding
// is recorded alone after the hold and, read in its instance's order
// (inOrder), moved to the hold's time: "lapse held:blind lapse", a silence
// that reads as found due again after it was held, with no recheck.
func TestAttackFoldTwiceInBatchReadsFoundAfterHeld(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	start := h.redisNow()
	if err := h.store.RecordBlind(ctx, session.BlindInterval{
		Start: start, End: start.Add(2 * time.Second), Reason: session.BlindFailover,
	}); err != nil {
		t.Fatal(err)
	}
	cfg := h.config(ModeEvents)
	cfg.PrefetchInterval = 0
	l := h.openIdle(cfg)
	rctx, stopRec := context.WithCancel(ctx)
	recorded := make(chan struct{})
	go func() { defer close(recorded); l.timeline.Run(rctx) }()

	h.renew("user", "default", 200*time.Millisecond)
	var due []session.Expired
	waitFor(t, waitLong, "the deadline to pass", func() bool {
		var err error
		due, _, err = h.store.Due(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(due) == 1
	})
	c, err := l.marker.mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.emit(ctx, c, []session.Expired{due[0], due[0]}, timeoutevent.SourceEvent); err != nil {
		t.Fatal(err)
	}
	stopRec()
	<-recorded
	if !h.heldUIDs()["user"] {
		t.Fatal("not held: the blind interval did not hold the batch")
	}
	es := h.timelineOf("user")
	logTimeline(t, es)
	got := steps(es)
	held := slices.Index(got, "held:blind")
	if held < 0 {
		t.Fatalf("timeline %q: no hold", got)
	}
	for i, s := range got {
		if s == "lapse" && i > held {
			t.Errorf("timeline %q: a lapse reads after the hold (at %v, the hold at %v), though both were found before it was held, in one batch",
				got, es[i].At.Format("15:04:05.000"), es[held].At.Format("15:04:05.000"))
		}
	}
}
