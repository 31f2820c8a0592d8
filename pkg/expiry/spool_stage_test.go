package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/spool"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// remindThenClose is a policy of a reminder, then a close after closeAfter.
func remindThenClose(closeAfter time.Duration) policy.Policy {
	return policy.Policy{
		DefaultTTL: 10 * time.Second,
		SegmentStages: map[string][]policy.Stage{
			"default": {
				{Action: timeoutevent.ActionRemind},
				{After: closeAfter, Action: timeoutevent.ActionClose, Text: "We closed this chat."},
			},
		},
	}
}

// stagesOn lists the stages of uid's events on the topic, in offset order.
func (h *harness) stagesOn(uid string) []int {
	h.t.Helper()
	var stages []int
	for _, ev := range h.events() {
		if ev.UID == uid {
			stages = append(stages, ev.Stage)
		}
	}
	return stages
}

// waiting reports whether uid's next stage waits in the index for the
// replay of the stage before it.
func (h *harness) waiting(uid string) bool {
	h.t.Helper()
	ks := h.store.Keyspace()
	score, err := h.rdb.ZScore(context.Background(), ks.IndexKey(session.Bucket(uid)), uid).Result()
	return err == nil && score == float64(session.AfterReplay.UnixMilli())
}

// TestSpooledReminderUserBackNoClose: a user who comes back after their
// reminder went to the spool gets no close, whether they come back
// before the replay (the replay then produces a reminder the consumer
// finds stale) or after it, between the replayed reminder and its close.
func TestSpooledReminderUserBackNoClose(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// Long enough for the test to renew between the replayed reminder
	// and its close on a busy machine.
	const closeAfter = 3 * time.Second
	h.savePolicy(remindThenClose(closeAfter))
	l, _ := h.startListener(h.config(ModeSweep))
	fault := h.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.NotEnoughReplicas, Count: -1})
	h.renew("early", "default", 200*time.Millisecond)
	h.renew("late", "default", 200*time.Millisecond)
	waitFor(t, waitLong, "both reminders spooled", func() bool { return l.spool.Len() >= 2 })
	waitFor(t, waitLong, "both closes waiting for the replay", func() bool { return h.waiting("early") && h.waiting("late") })
	h.renew("early", "default", time.Hour) // back before the replay
	fault.Remove()
	h.waitProduced(2)
	h.renew("late", "default", time.Hour) // back after the replayed reminder
	// Past when a close would be due, and a sweep after it.
	h.sweptPast(h.redisNow().Add(closeAfter + time.Second))
	for _, uid := range []string{"early", "late"} {
		if got := h.stagesOn(uid); len(got) != 1 || got[0] != 1 {
			t.Errorf("%s came back after the spooled reminder; the topic holds the stages %v, want the reminder alone", uid, got)
		}
	}
}

// TestSpooledReminderCrashBeforeSettle: a replica spooled a reminder,
// marked it spooled and crashed before it settled the index entry.
// Another replica that finds the entry settles it as spooled: the close
// waits for the replay, which comes when the first replica is back, and
// the close follows its delay after it.
func TestSpooledReminderCrashBeforeSettle(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const closeAfter = time.Second
	h.savePolicy(remindThenClose(closeAfter))
	ctx := context.Background()

	// What the crashed replica left: the reminder in its spool, the dedup
	// key marked spooled, the index entry as it found it.
	h.renew("victim", "default", 100*time.Millisecond)
	var found session.Expired
	waitFor(t, waitLong, "the silence to be due", func() bool {
		due, _, err := h.store.Due(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range due {
			if e.UID == "victim" {
				found = e
				return true
			}
		}
		return false
	})
	value, err := event(found, policy.Stage{Action: timeoutevent.ActionRemind}, false, timeoutevent.SourceSweep).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cfgA := h.config(ModeSweep)
	sp, err := spool.Open(cfgA.SpoolDir, int64(cfgA.SpoolMaxBytes))
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Append(value); err != nil {
		t.Fatal(err)
	}
	sp.Close()
	ks := h.store.Keyspace()
	if err := h.rdb.Set(ctx, ks.StageDedupKey(found.UID, found.Stage, found.Due), session.DedupSpooled(found.Deadline), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}

	h.start(h.config(ModeSweep))
	waitFor(t, waitLong, "the other replica to settle the reminder as spooled", func() bool { return h.waiting("victim") })
	// Past when the close would be due after the reminder was found,
	// and a sweep after it.
	h.sweptPast(h.redisNow().Add(closeAfter + time.Second))
	if got := h.stagesOn("victim"); len(got) != 0 {
		t.Fatalf("the topic holds the stages %v while the reminder waits in the crashed replica's spool", got)
	}

	h.start(cfgA)
	got := h.recordsOf("victim", 2)
	if got[0].ev.Stage != 1 || got[1].ev.Stage != 2 || !got[1].ev.Final {
		t.Fatalf("events %+v, want the reminder, then the close", got)
	}
	if gap := got[1].at.Sub(got[0].at); gap < closeAfter-100*time.Millisecond {
		t.Fatalf("the close reached the topic %v after the replayed reminder, want its delay of %v", gap, closeAfter)
	}
	if evs := h.events(); len(evs) != 2 {
		t.Fatalf("topic holds %d events, want the reminder and the close once each: %+v", len(evs), evs)
	}
}
