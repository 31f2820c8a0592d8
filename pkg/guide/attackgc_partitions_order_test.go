package guide

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackGCStagesOrderAcrossPartitions: docs/operations.md said
// partitions can be added, and that this "moves uids to other partitions
// (harmless here: events are deduplicated by id, and a user's events are
// a minute apart)". A user's stages are a minute apart when
// they are produced, not when they are read: while the consumers lag (a
// redeploy, a backlog) both wait on the topic and are read together. The
// reminder was produced before the partitions were added, on the user's
// old partition; the close after, on their new one. The consumer keeps a
// user's stages in order only within one partition (one key's records
// per partition): the reminder's send is refused once (a 503, retried
// 50ms later) and the close, on the other partition, overtakes it. The
// platform closes the conversation, then is asked to remind the user
// whether they are still there (docs/protocol.md, "Guide webhook": "The
// stages of one silence come as separate requests ... in order").
//
// A known limit, not fixed: keeping the order across partitions needs the
// listener to produce a silence's later stages to its first stage's
// partition (recorded with the stage it schedules). docs/operations.md,
// "Partitions and the consumer group", says so and how to add partitions
// without it.
func TestAttackGCStagesOrderAcrossPartitions(t *testing.T) {
	t.Skip("known limit: a user's stages keep their order within one partition only; partitions added while the group lags can reorder a silence's stages (docs/operations.md)")
	e := newEnv(t)
	hook := newOrderHook(t, 1) // the reminder's first sends answered 503
	cfg := e.cfg
	cfg.Sender, cfg.WebhookURL, cfg.WebhookSecret = SenderWebhook, hook.url, "0123456789abcdef0123456789abcdef"

	const uid = "gcp-moved"
	now := e.redisNow()
	d := now.Add(-4 * time.Second)
	reminder := timeoutevent.New(uid, session.DefaultSegment, d, d.Add(50*time.Millisecond), timeoutevent.SourceSweep)
	closing := reminder.AtStage(2, d.Add(3*time.Second), timeoutevent.ActionClose, "We closed this chat.", true)
	// The reminder on the user's partition before partitions were added,
	// the close on the one after: both keyed by the uid, as the listener
	// writes them.
	for p, ev := range map[int32]timeoutevent.Event{0: reminder, 1: closing} {
		b, err := ev.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		e.produceRaw(p, uid, b)
	}
	e.start(cfg)
	waitFor(t, "both stages to be taken", func() bool { return len(hook.taken()) == 2 })
	order := hook.taken()
	if order[0] != 1 || order[1] != 2 {
		t.Errorf("the webhook took the stages in the order %v, want the reminder before the close: "+
			"a user's stages on two partitions (partitions added between them) are not kept in order", order)
	}
}
