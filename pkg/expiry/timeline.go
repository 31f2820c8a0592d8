package expiry

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// What the listener decided about a user goes to their timeline
// (package timeline), for the platform's support team: each entry is
// recorded by the step of emit (batch.go) that carried the decision out,
// after it took effect, from the facts the verdict had. Recording never
// changes a verdict, adds no round trip, and never blocks (Record queues).
// A timeout's entries, in the order a silence meets them:
//
//   - lapse: found due (step 1), each time it is judged from the index;
//     rechecked instead when it was held and its release came. Folded
//     into the next entry of it in the same emit (its hold or outcome),
//     so that most silences cost one write here, not two; recorded
//     alone if none comes, or none within a second (findings).
//   - held (step 2 or 4b, once the hold set has it): the hold rule, until
//     when, and what the rule found (a blind interval and its reason, a
//     gateway instance). The minute rule's hold is the "deferred".
//   - deduped (step 6): produced or spooled already, or claimed by another
//     replica; stale (step 6) with rule stage-gone: the policy in force has
//     no such stage, and the silence ends without an event.
//   - produced or spooled (step 6), with the event's id; replayed when the
//     spool's replay put it on the topic.
//
// A hold a renewal or an end cancels is not the listener's to record:
// the script that cancels it appends its rechecked and stale entries
// (session.HoldNotes), whether or not the replica that held it is still
// there to see its release.

// Rules of the listener's entries besides the hold rules: a metric label
// each, so a small fixed set.
const (
	tlStageGone = "stage-gone" // stale: the policy in force has no such stage
	// deduped: the dedup key's answer.
	tlProduced         = "produced"
	tlSpooled          = "spooled"
	tlClaimedElsewhere = "claimed-elsewhere"
)

// blindReasons says each blind interval's reason for a person.
var blindReasons = map[string]string{
	session.BlindSweepGap:    "no listener swept the deadlines",
	session.BlindDataLost:    "Redis lost its data",
	session.BlindClockJump:   "Redis's clock stepped forward",
	session.BlindReadStall:   "a read of the deadlines stalled",
	session.BlindGateway:     "a gateway could not reach Redis",
	session.BlindFleetDown:   "no gateway was alive",
	session.BlindRenewals:    "a gateway's renewals failed",
	session.BlindRestart:     "Redis restarted",
	session.BlindFailover:    "Redis failed over",
	session.BlindDrain:       "a gateway drained its clients",
	session.BlindActivityLag: "the activity feed lagged",
}

// blindDetail says why users could not reach us in b.
func blindDetail(b session.BlindInterval) string {
	why, ok := blindReasons[b.Reason]
	if !ok {
		why = b.Reason
	}
	if b.Scope != "" {
		why += " (gateway " + b.Scope + ")"
	}
	return why
}

// silence is the entry of e's timeout, before its kind.
func silence(e session.Expired) timeline.Entry {
	return timeline.Entry{Stage: e.Stage, Segment: e.Segment, Deadline: e.Deadline.UnixMilli()}
}

// eventID is the id of the event of e's timeout.
func eventID(e session.Expired) string {
	return timeoutevent.StageID(e.UID, e.Deadline.UnixMilli(), e.Stage)
}

// foundKind is the entry of e's finding: a lapse, or a held one's
// recheck.
func foundKind(e session.Expired) timeline.Kind {
	if e.Rechecked {
		return timeline.KindRechecked
	}
	return timeline.KindLapse
}

// findings are the findings of one emit's items whose entries wait to
// be folded into the next entry of each (its hold or its outcome: one
// write for the two, see timeline.Entry.Found). What waits longer than
// findingsWait (Kafka or Redis slow to answer) is recorded alone then,
// off the pipeline goroutine, so that a lapse shows within about that of
// its finding, and one found by a listener that dies in a long emit was
// recorded; what is still waiting when emit ends is recorded alone too
// (flush). mu orders each item's entries in the recorder's queue.
type findings struct {
	mu    sync.Mutex
	items []*item // foundAt set while its entry waits, under mu
	timer *time.Timer
}

// findingsWait is how long a finding's entry waits to be folded.
const findingsWait = time.Second

// noteFound notes that it was found due: its entry waits in b's
// findings.
func (l *Listener) noteFound(b *batch, it *item) {
	if l.timeline == nil {
		return
	}
	f := &b.found
	f.mu.Lock()
	defer f.mu.Unlock()
	it.foundAt = time.Now()
	f.items = append(f.items, it)
	if f.timer == nil {
		f.timer = time.AfterFunc(findingsWait, func() { l.flushFindings(f) })
	}
}

// flushFindings records alone each finding of f that waits still: its
// item met no entry to fold it into in time, or in its emit at all (left
// to another replica or a later sweep, not held, or cut short by an
// error).
func (l *Listener) flushFindings(f *findings) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.timer != nil {
		f.timer.Stop()
	}
	for _, it := range f.items {
		l.noteFoundAlone(it)
	}
}

// noteFoundAlone records the finding of it alone, if it waits still. Under
// its findings' mu.
func (l *Listener) noteFoundAlone(it *item) {
	if it.foundAt.IsZero() {
		return
	}
	en := silence(it.Expired)
	en.Kind = foundKind(it.Expired)
	l.timeline.RecordAt(it.UID, en, it.foundAt)
	it.foundAt = time.Time{}
}

// noteOf records en, made at at, of item it of b: with its finding
// folded in, when that waits still.
func (l *Listener) noteOf(b *batch, it *item, en timeline.Entry, at time.Time) {
	b.found.mu.Lock()
	defer b.found.mu.Unlock()
	if !it.foundAt.IsZero() {
		en = timeline.Fold(en, foundKind(it.Expired), it.foundAt, at)
		it.foundAt = time.Time{}
	}
	l.timeline.RecordAt(it.UID, en, at)
}

// notesHeld records the holds of items (held says which were held): the
// findings of those not held alone first (one listed twice in a batch
// is held once: both were found before the hold), then the holds.
func (l *Listener) notesHeld(b *batch, items []*item, held []bool) {
	if l.timeline == nil {
		return
	}
	b.found.mu.Lock()
	for i, it := range items {
		if !held[i] {
			l.noteFoundAlone(it)
		}
	}
	b.found.mu.Unlock()
	for i, it := range items {
		if held[i] {
			l.noteOf(b, it, heldEntry(it.Expired, it.verdict), time.Now())
		}
	}
}

// noteHeld records that the hold set holds e by v (a hold verdict).
func (l *Listener) noteHeld(e session.Expired, v verdict) {
	l.timeline.Record(e.UID, heldEntry(e, v))
}

// heldEntry is the entry of e held by v.
func heldEntry(e session.Expired, v verdict) timeline.Entry {
	en := silence(e)
	en.Kind, en.Rule, en.Until = timeline.KindHeld, string(v.rule), v.release.UnixMilli()
	switch v.rule {
	case ruleBlind:
		en.BlindMS = [2]int64{v.blind.Start.UnixMilli(), v.blind.End.UnixMilli()}
		en.Detail = blindDetail(v.blind)
	case ruleGatewayDead:
		en.Detail = "gateway " + v.via + " missed a heartbeat"
	case ruleFleetDown:
		en.Detail = "no gateway alive"
	case ruleActivityLag:
		en.Detail = "the activity feed had not passed the deadline"
	case ruleBrake:
		en.Detail = "mass-expiry brake engaged"
	case ruleMinute:
		en.Detail = "second silence in the minute window"
	case ruleRetry:
		en.Detail = "released, but the recheck could not run"
	}
	return en
}

// noteOutcome records what became of it, an item of b, at the end of
// emit, if anything the timeline shows. settled says whether its settle
// went through.
func (l *Listener) noteOutcome(b *batch, it *item, settled bool) {
	en := silence(it.Expired)
	switch it.verdict.reason {
	case whyProduced:
		en.Kind, en.Event, en.Detail = timeline.KindProduced, eventID(it.Expired), stageDetail(it.verdict)
	case whySpooled:
		en.Kind, en.Event, en.Detail = timeline.KindSpooled, eventID(it.Expired), stageDetail(it.verdict)
	case whyProducedBefore:
		en.Kind, en.Rule, en.Event = timeline.KindDeduped, tlProduced, eventID(it.Expired)
	case whySpooledBefore:
		en.Kind, en.Rule, en.Event = timeline.KindDeduped, tlSpooled, eventID(it.Expired)
	case whyClaimedElsewhere:
		en.Kind, en.Rule = timeline.KindDeduped, tlClaimedElsewhere
	case whyStageGone:
		en.Kind, en.Rule = timeline.KindStale, tlStageGone
		en.Detail = fmt.Sprintf("the policy in force has no stage %d: the silence ends without an event", it.Stage)
	default:
		return
	}
	// One whose settle failed is found again and recorded then; an event
	// Kafka or the spool took is recorded all the same.
	if !settled && en.Kind != timeline.KindProduced && en.Kind != timeline.KindSpooled {
		return
	}
	at := time.Now()
	if (en.Kind == timeline.KindProduced || en.Kind == timeline.KindSpooled) && !it.sentAt.IsZero() {
		// At when it was sent: the consumer may send the guide before
		// Kafka's answer reaches this listener, and the replay send a
		// spooled one.
		at = it.sentAt
	}
	l.noteOf(b, it, en, at)
}

// stageDetail says what the stage of v's event does, and whether it is
// the silence's last: "a notify stage, the last".
func stageDetail(v verdict) string {
	d := "a " + cmp.Or(v.stage.Action, timeoutevent.ActionRemind) + " stage"
	if v.last {
		d += ", the last"
	}
	return d
}

// noteReplayed records that the replay put a spooled event on the topic.
func (l *Listener) noteReplayed(ev timeoutevent.Event) {
	en := timeline.Entry{Kind: timeline.KindReplayed, Event: ev.ID, Stage: ev.Stage, Segment: ev.Segment, Deadline: ev.DeadlineMS}
	l.timeline.Record(ev.UID, en)
}
