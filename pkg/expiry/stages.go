package expiry

import (
	"context"
	"fmt"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// A silence goes through the stages of its segment's timeout policy
// (package policy): stage 1 at the deadline, each later one its delay
// after the one before, while the user stays silent. The stages are
// scheduled in the deadline index itself, by Redis's clock, not by timers
// in a process: settling a stage's entry (Store.Settle) leaves it in the
// index, due for the next stage, and only the last stage's entry goes. A
// renewal writes a new deadline and drops the stages left, so the user's
// next silence starts again at stage 1. Every stage is detected, held in
// an outage, deduplicated (per uid, stage and minute window), produced,
// spooled and settled exactly as the first: the pipeline does not tell
// them apart but for the event it writes and the entry it leaves.
//
// A later stage is due its delay after the stage before was found due
// (Redis's clock at the sweep that found it), which is when that stage
// was due unless it was held. A stage that went to a spool goes out only
// when that spool is replayed, and the spool is one replica's, on its
// own disk: its settle leaves the next stage in the index waiting
// (session.AfterReplay), due for no replica, and the replay that produces
// the stage makes the next one due its delay after it (followReplayed).
// So the shared index never lists a later stage due while the stage
// before it is only in some replica's spool, whether that replica is cut
// off from Kafka or down with the spool on its volume: the next stage
// waits until the spool is replayed. A renewal meanwhile ends the silence
// and drops the waiting stage, as any. The stages are read from the
// policy in force when a stage is due. If a policy change left a silence
// at a stage its segment no longer has, the silence ends there, without
// an event.

// event is the timeout event of e's stage; last says that none follows.
func event(e session.Expired, stage policy.Stage, last bool, source string) timeoutevent.Event {
	return timeoutevent.New(e.UID, e.Segment, e.Deadline, e.Detected, source).AtStage(e.Stage, e.Due, stage.Action, stage.Text, last)
}

// replayed is what followReplayed needs of a replayed stage ev, with the
// delay of the stage after it in the policy in force (zero if it has
// none any more: the sweep then ends the silence there).
func (l *Listener) replayed(ev timeoutevent.Event) session.Replayed {
	r := session.Replayed{UID: ev.UID, Stage: ev.Stage, Deadline: ev.Deadline(), Due: time.UnixMilli(ev.DueMS)}
	if stages := l.policy.Current().Stages(ev.Segment); ev.Stage < len(stages) {
		r.Next = stages[ev.Stage].After
	}
	return r
}

// followReplayed makes the next stages of stages the replay just
// produced, late, due their delay after now (Store.FollowReplayed). It
// retries while Redis fails, since until it succeeds those stages wait,
// due for no replica; it returns false if ctx is done first, and then
// the chunk is not committed: the next run replays it again (the same
// event ids, which downstream collapses) and follows it then.
func (l *Listener) followReplayed(ctx context.Context, rs []session.Replayed) bool {
	backoff := 100 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		err := l.store.FollowReplayed(rctx, rs)
		cancel()
		if err == nil {
			return true
		}
		l.replayDown.Fail(fmt.Errorf("make the stages after %d replayed ones due: %w", len(rs), err))
		sleep(ctx, backoff)
		backoff = min(backoff*2, 5*time.Second)
		if ctx.Err() != nil {
			return false
		}
	}
}
