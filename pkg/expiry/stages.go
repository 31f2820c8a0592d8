package expiry

import (
	"context"
	"time"

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
// was due unless it was held. A stage that went to the spool goes out
// only when the spool is replayed: while events queue there, later stages
// wait in the index, and the replay moves the next stage to its delay
// after the one it produced (followSpooled). The stages are read from the policy in
// force when a stage is due. If a
// policy change left a silence at a stage its segment no longer has, the
// silence ends there, without an event.

// stageOf is what e's stage says in the policy in force: its action and
// text, and e with NextDue filled in when a later stage follows. ok is
// false when the policy has no such stage any more.
func (l *Listener) stageOf(e session.Expired) (out session.Expired, action, text string, ok bool) {
	stages := l.policy.Current().Stages(e.Segment)
	if e.Stage < 1 || e.Stage > len(stages) {
		return e, "", "", false
	}
	st := stages[e.Stage-1]
	if e.Stage < len(stages) && st.Action != timeoutevent.ActionClose {
		// Its delay after this stage goes out: at its due time, or later
		// when it was held (an outage, the minute rule), so that a
		// reminder held for a minute is not followed at once by the next.
		from := e.Due
		if e.Detected.After(from) {
			from = e.Detected
		}
		e.NextDue = from.Add(stages[e.Stage].After)
	}
	return e, st.Action, st.Text, true
}

// event is the timeout event of e's stage.
func event(e session.Expired, action, text, source string) timeoutevent.Event {
	return timeoutevent.New(e.UID, e.Segment, e.Deadline, e.Detected, source).AtStage(e.Stage, e.Due, action, text)
}

// followSpooled moves the next stage of a silence whose stage ev the
// replay just produced, late, to its delay after now.
func (l *Listener) followSpooled(ctx context.Context, ev timeoutevent.Event) {
	stages := l.policy.Current().Stages(ev.Segment)
	if ev.Stage < 1 || ev.Stage >= len(stages) {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if _, err := l.store.Reschedule(rctx, ev.UID, ev.Stage+1, ev.Deadline(), stages[ev.Stage].After); err != nil {
		// The next stage then follows its delay after the stage was found
		// due, as it was scheduled: early, not lost.
		l.log.Warn("move a later stage after its replayed one", "uid", ev.UID, "stage", ev.Stage+1, "err", err)
	}
}
