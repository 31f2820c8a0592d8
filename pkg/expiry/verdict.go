package expiry

import (
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// What becomes of one timeout is decided here, by rules alone: decide
// takes every fact its fate rests on and returns a verdict with the rule
// or reason that gave it. Nothing here reads Redis or Kafka or counts a
// metric; emit (batch.go) gathers the facts for a batch and carries the
// verdicts out. A timeout is judged by decide again each time a step of
// emit learns more of it (emit's doc lists which facts each step adds):
//
//   - Found (emit's step 1). An outage rule may hold it (outageHold,
//     hold.go). While events queue in this replica's spool, a later stage
//     is left in the index, for a replica that produces directly or for
//     this one once its spool is replayed (one whose stage before is in a
//     spool is not due at all: see stages.go). A stage the policy in force
//     no longer has ends its silence: settled, with no event. Any other is
//     claimed (dedup.go).
//   - Claimed (step 4). Produced already: settled. Spooled already:
//     settled, its next stage waiting for the replay. Claimed by another
//     replica: left to it. A second silence in a minute window whose guide
//     may have gone out: held to the window's end (the minute rule). Ours:
//     held while the mass-expiry brake is engaged and would hold it
//     (brakeWouldHold), else produced, or spooled while events queue in
//     the spool.
//   - Written (step 5). Produced: settled, its next stage due.
//     Kafka did not take it: left to another replica that is alive unless
//     one failed it before, else spooled. Spooled: settled, its next stage
//     waiting for the replay. Not spooled either: left, its claim
//     released, for the next sweep.
//
// Words, each with one meaning in this package:
//
//   - hold: the verdict actHold. The timeout's entry moves out of the
//     deadline index into the hold set (session.Store.HoldEach) until its
//     release time; the sweep then finds it again, Rechecked, and judges
//     it afresh. "Held" means only that: a hold, by a hold rule
//     (holdRule), counted by rule in stillthere_listener_held_total.
//   - outage rule: the four hold rules of hold.go (blind, gateway-dead,
//     fleet-down, activity-lag), judged before the claim. The minute rule and the brake
//     are hold rules judged after it.
//   - claim: the dedup key's value while one replica produces the timeout
//     (dedup.go); its reply (claimed) is a fact of the second judgement.
//     A claim is resolved once the timeout is written: set to produced or
//     spooled, released, or left to another replica.
//   - mark: only the sweep mark (mark.go): a replica records in Redis that
//     it swept, and reads the control state back. (Package session also
//     says a dedup key is marked produced or stale: in this package that
//     is resolving a claim.)
//   - left: the entry stays in the index, for another replica or a later
//     sweep. Settled: the stage is done, and its entry moves on to the next
//     stage or leaves the index.
//   - deferred: not a verdict of its own. The claim's answer defer (a
//     second silence in a window whose guide may have gone out) is a hold
//     by the minute rule, to the window's end.
//   - another replica does it, in three places: a replica on standby
//     (Listener.standby: it cannot produce and another is alive) does not
//     sweep at all; a timeout another replica claimed is left to it
//     (claimed-elsewhere, step 4); one Kafka refused here is left for
//     another replica to claim (left-to-replica, step 5).

// act is what the listener does with a timeout.
type act int

const (
	actClaim   act = iota // no rule keeps it: claim its dedup key, then decide again
	actProduce            // ours: produce its event to Kafka
	actSpool              // ours, and Kafka is not ours now: write its event to the spool
	actSettle             // settle its index entry, its next stage due at next
	actLeave              // leave its index entry alone
	actHold               // move it to the hold set until release, then judge it again
)

var actNames = [...]string{"claim", "produce", "spool", "settle", "leave", "hold"}

func (a act) String() string { return actNames[a] }

// holdRule names why a timeout is held: the rule label of
// stillthere_listener_held_total.
type holdRule string

const (
	ruleBlind       holdRule = "blind"
	ruleGatewayDead holdRule = "gateway-dead"
	ruleFleetDown   holdRule = "fleet-down"
	ruleActivityLag holdRule = "activity-lag"
	ruleBrake       holdRule = "mass-expiry"
	ruleMinute      holdRule = "minute"
	ruleRetry       holdRule = "retry" // released, but the recheck could not run
)

// holdRules are the hold rules and what each holds, for the metric's help.
var holdRules = []struct {
	rule  holdRule
	holds string
}{
	{ruleBlind, "a deadline in or near a blind interval, until the grace after it"},
	{ruleGatewayDead, "a deadline near the last heartbeat of a gateway instance of the user that missed one since, until the grace after it"},
	{ruleFleetDown, "every deadline while no gateway instance is alive, until the grace after one is"},
	{ruleActivityLag, "a deadline at or past the activity feed's watermark, until it has had time to pass it"},
	{ruleBrake, "a lapse past the mass-expiry brake's threshold, and while it is engaged a later stage or one held before, until the grace after it was due"},
	{ruleMinute, "a second silence in a minute window whose guide may have gone out, until the window's end"},
	{ruleRetry, "a released timeout whose recheck could not run, until the next sweep"},
}

// holdRulesHelp lists the hold rules as the metric's help says them.
func holdRulesHelp() string {
	parts := make([]string, len(holdRules))
	for i, r := range holdRules {
		parts[i] = string(r.rule) + " (" + r.holds + ")"
	}
	return strings.Join(parts, "; ")
}

// reason names why a timeout is settled or left.
type reason string

const (
	whyStageGone        reason = "stage-gone"        // settled: the policy in force has no such stage; no event
	whyProducedBefore   reason = "produced-before"   // settled: this very timeout was produced already
	whySpooledBefore    reason = "spooled-before"    // settled: it went to a spool already
	whyProduced         reason = "produced"          // settled: Kafka took its event
	whySpooled          reason = "spooled"           // settled: the spool took its event
	whyAwaitsReplay     reason = "awaits-replay"     // left: a later stage, while events queue in this spool
	whyClaimedElsewhere reason = "claimed-elsewhere" // left: another replica produces it and settles it
	whyLeftToReplica    reason = "left-to-replica"   // left: Kafka refused it here; another replica may produce it
	whyUnsent           reason = "unsent"            // left: neither produced nor spooled; its claim released
)

// verdict is what becomes of one timeout, and why.
type verdict struct {
	act     act
	rule    holdRule  // actHold: the rule that holds it
	release time.Time // actHold: when the hold set releases it to the sweep, to be judged again
	// blind and via are what an outage rule found, for the user's
	// timeline: the blind interval that holds it (ruleBlind), the gateway
	// instance that missed a heartbeat (ruleGatewayDead).
	blind  session.BlindInterval
	via    string
	reason reason // actSettle, actLeave: why
	// stage is what the timeout's stage says: its event's action and text.
	stage policy.Stage
	// next is when the stage after it is due once it is settled: zero
	// when none follows, session.AfterReplay when it waits for a replay.
	next time.Time
	// last says that no stage follows it: its event is final.
	last bool
}

// write is what became of a timeout's event.
type write int

const (
	writeNotYet   write = iota // not written yet
	writeProduced              // Kafka took it
	writeRefused               // Kafka did not take it
	writeSpooled               // the spool took it
	writeUnsent                // the spool did not take it either: it stays in the index
)

// claimed is the reply to a timeout's claim (session.ParseClaim).
type claimed struct {
	outcome string // one of session.Claim*; "" before the claim
	failed  int    // a fresh claim's count of replicas that failed to produce it before
}

// timeout is one found timeout and what emit's steps learned of it.
type timeout struct {
	session.Expired         // found by the sweep, an expired event or a release
	claim           claimed // set by step 3, the claim
	write           write   // set by step 5, produce or spool
}

// facts are what the verdicts of one batch rest on besides each timeout's
// own, as the steps learn them (emit's numbered steps).
type facts struct {
	control    session.Control // step 1: by Redis's clock, read after the timeouts were found
	grace      time.Duration   // step 1: the outage grace
	sweepEvery time.Duration   // step 1: the sweep interval: a hold found late lasts to the next sweep
	policy     policy.Policy   // step 1: the timeout policy in force
	// spooling: this replica does not produce directly (the topic is not
	// known to exist, or events wait in its spool). Read at step 1, and
	// again at step 5, as the spool may have been replayed since.
	spooling bool
	// braking: the mass-expiry brake is engaged, this batch's lapses
	// counted. Step 4, and only when the brake would hold one of them.
	braking bool
	// othersAlive: another replica marked a sweep lately and could produce
	// then. Step 5, once Kafka answered.
	othersAlive bool
}

// decide is the verdict on t, by the rules above.
func decide(f facts, t timeout) verdict {
	if t.claim.outcome == "" {
		if o := outageHold(f.control, t.Expired, f.grace); !o.release.IsZero() {
			return verdict{act: actHold, rule: o.rule, release: o.release, blind: o.blind, via: o.via}
		}
		if f.spooling && t.Stage > 1 {
			return verdict{act: actLeave, reason: whyAwaitsReplay}
		}
	}
	stage, next, ok := stageOf(f.policy.Stages(t.Segment), t.Expired)
	if !ok {
		return verdict{act: actSettle, reason: whyStageGone}
	}
	v := verdict{stage: stage, next: next, last: next.IsZero()}
	settle := func(why reason) verdict { v.act, v.reason = actSettle, why; return v }
	switch t.claim.outcome {
	case "":
		v.act = actClaim
		return v
	case session.ClaimDone:
		return settle(whyProducedBefore)
	case session.ClaimSpooled:
		v.next = afterReplay(next)
		return settle(whySpooledBefore)
	case session.ClaimDefer:
		v.act, v.rule, v.release = actHold, ruleMinute, session.DedupWindowEnd(t.Due)
		return v
	case session.ClaimFresh:
		// ours: below
	default: // session.ClaimBusy, or a reply this build does not know
		v.act, v.reason = actLeave, whyClaimedElsewhere
		return v
	}
	// Ours.
	switch t.write {
	case writeNotYet:
		switch {
		case f.braking && brakeWouldHold(f, t):
			v.act, v.rule, v.release = actHold, ruleBrake, brakeRelease(f, t)
		case f.spooling:
			v.act = actSpool
		default:
			v.act = actProduce
		}
	case writeProduced:
		return settle(whyProduced)
	case writeRefused:
		// Left to another replica, counted in its dedup key, and spooled
		// only by the second replica that fails it, or when no other is
		// alive: so one broken replica does not spool a share of every
		// timeout while a healthy one could produce it.
		if f.othersAlive && t.claim.failed == 0 {
			v.act, v.reason = actLeave, whyLeftToReplica
		} else {
			v.act = actSpool
		}
	case writeSpooled:
		v.next = afterReplay(next)
		return settle(whySpooled)
	case writeUnsent:
		v.act, v.reason = actLeave, whyUnsent
	}
	return v
}

// lapse reports whether t counts as a lapse for the mass-expiry brake: a
// first stage, claimed by us, and not one released from a hold (Rechecked)
// once the grace after it was due had passed: that one waited the grace
// already, as the brake would hold it, and the brake's own hold counted it
// when it held it. One released sooner (a stall of the listener's own read
// settles in 3 s, the activity feed's watermark and the minute rule hold
// for less than the grace) was never counted: held before its claim, it is
// counted now, or a crowd lapsing in a stall, as a mass expiry's big round
// trips make likely, would never engage the brake. Both times are its
// bucket's master's (its deadline, and when the read that released it ran
// there), as its release was: the control state's clock, another master's,
// may read a little behind it, and would count a crowd the brake released
// a second time. A later stage is no new lapse: its user went silent a
// stage ago.
func lapse(f facts, t timeout) bool {
	if t.claim.outcome != session.ClaimFresh || t.Stage != 1 {
		return false
	}
	return !t.Rechecked || t.Detected.Before(t.Due.Add(f.grace))
}

// brakeWouldHold reports whether the brake, were it engaged, would hold
// t, which we claimed: a lapse, and uncounted every other whose grace
// after it was due has not passed. That is a later stage (a close must not
// end the chat of someone who tried to answer its reminder) and one held
// before by another rule (the minute rule holds to its window's end, which
// may come before that grace). One the brake released has had its grace,
// and is not held again.
func brakeWouldHold(f facts, t timeout) bool {
	if t.claim.outcome != session.ClaimFresh || t.write != writeNotYet {
		return false
	}
	return lapse(f, t) || f.control.Now.Before(t.Due.Add(f.grace))
}

// brakeRelease is when the brake's hold releases t: the grace after it
// was due, as a blind interval holds until the grace after its end. Not after its
// detection, which a storm makes late, so that a crowd that really left is
// guided a grace after its deadlines and not later. One found a grace late
// or more is held to the next sweep and checked again then.
func brakeRelease(f facts, t timeout) time.Time {
	return later(t.Due.Add(f.grace), f.control.Now.Add(f.sweepEvery))
}

// stageOf is what e's stage says among its segment's stages, and when the
// stage after it is due (zero when none follows). ok is false when there
// is no such stage any more.
func stageOf(stages []policy.Stage, e session.Expired) (stage policy.Stage, next time.Time, ok bool) {
	if e.Stage < 1 || e.Stage > len(stages) {
		return policy.Stage{}, time.Time{}, false
	}
	stage = stages[e.Stage-1]
	if e.Stage < len(stages) && stage.Action != timeoutevent.ActionClose {
		// Its delay after this stage goes out: at its due time, or later
		// when it was found late (released from a hold: an outage, the
		// minute rule), so that a reminder held for a minute is not
		// followed at once by the next.
		next = later(e.Detected, e.Due).Add(stages[e.Stage].After)
	}
	return stage, next, true
}

// afterReplay is the next due time of a stage that went to a spool: its
// next stage, if any, waits until the replay produced it.
func afterReplay(next time.Time) time.Time {
	if next.IsZero() {
		return next
	}
	return session.AfterReplay
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
