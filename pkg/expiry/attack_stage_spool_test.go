package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// onTopic is a timeout event and when it reached the topic, by the
// producer's record timestamp: from then on a consumer can send it.
type onTopic struct {
	ev timeoutevent.Event
	at time.Time
}

// recordsOf reads the topic to its end and returns uid's events with
// their record timestamps, in offset order.
func (h *harness) recordsOf(uid string, want int) []onTopic {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.kafka.ListenAddrs()...), kgo.ConsumeTopics(testTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		h.t.Fatal(err)
	}
	defer cl.Close()
	var out []onTopic
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			h.t.Fatalf("read %d of %d events of %s: %v", len(out), want, uid, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			ev, err := timeoutevent.Parse(r.Value)
			if err != nil {
				h.t.Fatal(err)
			}
			if ev.UID == uid {
				out = append(out, onTopic{ev: ev, at: r.Timestamp})
			}
		})
	}
	return out
}

// TestAttackKafkaOutageAcrossStages: "each later stage fires its own
// delay after the one before, as long as the user stays silent", across
// Kafka outages too. Kafka refuses produces from before a silence's
// reminder until after its close was due: the listener spools the
// reminder, schedules the close a delay after it although the reminder
// went nowhere, spools the close too, and replays both in one chunk once
// Kafka is back. A consumer then gets the reminder and the close at the
// same moment: the user is closed without a moment to answer the
// reminder (README: "a held reminder is never followed at once by the
// close"; a spooled one is).
func TestAttackKafkaOutageAcrossStages(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const closeAfter = time.Second
	p := policy.Policy{
		DefaultTTL: 10 * time.Second,
		SegmentStages: map[string][]policy.Stage{
			"default": {
				{Action: timeoutevent.ActionRemind},
				{After: closeAfter, Action: timeoutevent.ActionClose, Text: "We closed this chat."},
			},
		},
	}
	h.savePolicy(p)
	l, stop := h.startListener(h.config(ModeSweep))
	defer stop()
	outage := h.kafka.Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce},
		Topic: testTopic,
		Err:   kerr.NotEnoughReplicas,
		Count: -1,
	})
	h.renew("sid", "default", 200*time.Millisecond)
	waitFor(t, waitLong, "the reminder to be spooled", func() bool { return l.spool.Len() >= 1 })
	// Past when the close would have been due after the reminder was
	// found, and a sweep after it: the close waits in the index, not in
	// the spool behind the reminder.
	h.sweptPast(h.redisNow().Add(closeAfter + 500*time.Millisecond))
	if n := l.spool.Len(); n != 1 {
		t.Fatalf("spool holds %d events, want the reminder alone", n)
	}
	outage.Remove()

	got := h.recordsOf("sid", 2)
	stop()
	if got[0].ev.Stage != 1 || got[1].ev.Stage != 2 || !got[1].ev.Final {
		t.Fatalf("events %+v, want the reminder, then the close", got)
	}
	if gap := got[1].at.Sub(got[0].at); gap < closeAfter-100*time.Millisecond {
		t.Errorf("the close reached the topic %v after the reminder, want its delay of %v: a consumer sends both at once "+
			"(reminder due %s, close due %s, both replayed from the spool)",
			gap, closeAfter, time.UnixMilli(got[0].ev.DueMS).Format("15:04:05.000"), time.UnixMilli(got[1].ev.DueMS).Format("15:04:05.000"))
	}
}
