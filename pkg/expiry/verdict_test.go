package expiry

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestDecide is the rules' interplay, a row each: the facts of one
// timeout at one step of emit, and the verdict on it. lapse and asks say
// whether the batch counts it as a lapse for the mass-expiry brake, and
// whether it asks the brake at all.
func TestDecide(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000) // a minute window's start
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	const grace = 10 * time.Second
	const sweepEvery = 100 * time.Millisecond
	pol := policy.Policy{SegmentStages: map[string][]policy.Stage{
		session.DefaultSegment: {
			{Action: timeoutevent.ActionRemind},
			{After: 30 * time.Second, Action: timeoutevent.ActionRemind, Text: "Still with us?"},
			{After: 30 * time.Second, Action: timeoutevent.ActionClose, Text: "We closed this chat."},
		},
		"short": {{Action: timeoutevent.ActionRemind}},
	}}
	blind := func(from, to float64) []session.BlindInterval {
		return []session.BlindInterval{{Start: at(from), End: at(to), Reason: session.BlindSweepGap}}
	}
	fresh := claimed{outcome: session.ClaimFresh}
	hold := func(rule holdRule, until float64) verdict {
		return verdict{act: actHold, rule: rule, release: at(until)}
	}
	next := func(v verdict, s float64) verdict { v.next = at(s); return v }
	claim := verdict{act: actClaim}
	produce := verdict{act: actProduce}
	spool := verdict{act: actSpool}
	settle := func(why reason) verdict { return verdict{act: actSettle, reason: why} }
	leave := func(why reason) verdict { return verdict{act: actLeave, reason: why} }
	afterReplay := func(v verdict) verdict { v.next = session.AfterReplay; return v }

	tests := []struct {
		name string
		// The timeout: its stage (1 if 0), when it was due, when it was
		// found (now if 0), its segment (the default if "").
		stage     int
		due, now  float64
		found     float64
		segment   string
		rechecked bool
		claim     claimed
		write     write
		// The batch's facts.
		blind                          []session.BlindInterval
		spooling, braking, othersAlive bool

		want        verdict
		lapse, asks bool
	}{
		// Found: the outage rules, the spool, the stage policy.
		{name: "found on time: claimed", due: 100, now: 100, want: next(claim, 130)},
		{name: "deadline in a blind interval: held to the grace after it", due: 95, now: 100,
			blind: blind(90, 99), want: hold(ruleBlind, 109)},
		{name: "an outage holds even a stage the policy no longer has", segment: "short", stage: 2, due: 95, now: 100,
			blind: blind(90, 99), want: hold(ruleBlind, 109)},
		{name: "while spooling, a later stage waits in the index for the replay", stage: 2, due: 130, now: 130,
			spooling: true, want: leave(whyAwaitsReplay)},
		{name: "while spooling, a first stage is claimed", due: 100, now: 100, spooling: true, want: next(claim, 130)},
		{name: "a stage the policy no longer has ends the silence, with no event", segment: "short", stage: 2, due: 130, now: 130,
			want: settle(whyStageGone)},
		{name: "the last stage, a close, has no stage after it", stage: 3, due: 160, now: 160, want: claim},
		{name: "found late: the next stage is due its delay after it was found", due: 100, now: 105, want: next(claim, 135)},

		// Claimed: the claim's reply.
		{name: "produced before: settled, its next stage due", due: 100, now: 100,
			claim: claimed{outcome: session.ClaimDone}, want: next(settle(whyProducedBefore), 130)},
		{name: "spooled before: settled, its next stage waiting for the replay", due: 100, now: 100,
			claim: claimed{outcome: session.ClaimSpooled}, want: afterReplay(settle(whySpooledBefore))},
		{name: "spooled before, the last stage: settled, nothing waits", stage: 3, due: 160, now: 160,
			claim: claimed{outcome: session.ClaimSpooled}, want: settle(whySpooledBefore)},
		{name: "claimed by another replica: left to it", due: 100, now: 100,
			claim: claimed{outcome: session.ClaimBusy}, want: next(leave(whyClaimedElsewhere), 130)},
		{name: "a second silence in a window whose guide may have gone out: held to the window's end", due: 100, now: 100,
			claim: claimed{outcome: session.ClaimDefer}, want: next(hold(ruleMinute, 120), 130)},
		{name: "ours: produced", due: 100, now: 100, claim: fresh,
			want: next(produce, 130), lapse: true, asks: true},
		{name: "ours while spooling: spooled", due: 100, now: 100, claim: fresh, spooling: true,
			want: next(spool, 130), lapse: true, asks: true},

		// The mass-expiry brake, engaged.
		{name: "brake: a lapse is held until the grace after its deadline", due: 100, now: 100, claim: fresh, braking: true,
			want: next(hold(ruleBrake, 110), 130), lapse: true, asks: true},
		// acce61b: it was held until the grace after the sweep that found
		// it, and a storm's lateness was added to the grace.
		{name: "brake: a lapse found late is held until the grace after its deadline, not after it was found",
			due: 100, now: 106, claim: fresh, braking: true,
			want: next(hold(ruleBrake, 110), 136), lapse: true, asks: true},
		{name: "brake: a lapse found a grace late or more is held to the next sweep", due: 100, now: 112, claim: fresh, braking: true,
			want: next(hold(ruleBrake, 112.1), 142), lapse: true, asks: true},
		// d775192: a later stage is no new lapse, and it went out at once,
		// closing the chat of a user who answered its reminder.
		{name: "brake: a later stage, a close, within its grace is held, uncounted", stage: 3, due: 160, now: 160,
			claim: fresh, braking: true, want: hold(ruleBrake, 170), asks: true},
		// 2fe55a1: the minute rule released it, rechecked, and the brake let
		// it out at its window's end, within the grace. Counted: a hold
		// before its claim never counted it (TestStallKeepsTheBrake).
		{name: "brake: a first stage the minute rule released within its grace is held, counted",
			due: 115, now: 120, rechecked: true, claim: fresh, braking: true,
			want: next(hold(ruleBrake, 125), 150), asks: true, lapse: true},
		{name: "brake: a first stage a stall released within its grace, brake not engaged: produced, counted",
			due: 115, now: 119, rechecked: true, claim: fresh,
			want: next(produce, 149), asks: true, lapse: true},
		{name: "brake: one held before whose grace has passed has had it: produced", due: 100, now: 115, rechecked: true,
			claim: fresh, braking: true, want: next(produce, 145)},
		{name: "brake: a later stage past its grace is produced", stage: 2, due: 130, now: 141, claim: fresh, braking: true,
			want: next(produce, 171)},
		{name: "brake: another replica's claim is left to it", due: 100, now: 100,
			claim: claimed{outcome: session.ClaimBusy}, braking: true, want: next(leave(whyClaimedElsewhere), 130)},
		{name: "brake: it holds before the spool", due: 100, now: 100, claim: fresh, braking: true, spooling: true,
			want: next(hold(ruleBrake, 110), 130), lapse: true, asks: true},
		{name: "brake not engaged: a later stage is produced, yet asks the brake", stage: 3, due: 160, now: 160, claim: fresh,
			want: produce, asks: true},
		{name: "brake: what was written is not held", due: 100, now: 100, claim: fresh, braking: true, write: writeProduced,
			want: next(settle(whyProduced), 130), lapse: true},

		// Written.
		{name: "produced: settled, its next stage due", due: 100, now: 100, claim: fresh, write: writeProduced,
			want: next(settle(whyProduced), 130), lapse: true},
		{name: "Kafka refused it, another replica is alive and none failed it before: left to that one", due: 100, now: 100,
			claim: fresh, write: writeRefused, othersAlive: true, want: next(leave(whyLeftToReplica), 130), lapse: true},
		{name: "Kafka refused it, and another replica failed it before: spooled", due: 100, now: 100,
			claim: claimed{outcome: session.ClaimFresh, failed: 1}, write: writeRefused, othersAlive: true,
			want: next(spool, 130), lapse: true},
		{name: "Kafka refused it, and no other replica is alive: spooled", due: 100, now: 100,
			claim: fresh, write: writeRefused, want: next(spool, 130), lapse: true},
		{name: "spooled: settled, its next stage waiting for the replay", due: 100, now: 100, claim: fresh, write: writeSpooled,
			want: afterReplay(settle(whySpooled)), lapse: true},
		{name: "spooled, a close: settled, nothing waits", stage: 3, due: 160, now: 160, claim: fresh, write: writeSpooled,
			want: settle(whySpooled)},
		{name: "neither produced nor spooled: left, its claim released", due: 100, now: 100, claim: fresh, write: writeUnsent,
			want: next(leave(whyUnsent), 130), lapse: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stage, segment, found := max(tt.stage, 1), tt.segment, tt.found
			if segment == "" {
				segment = session.DefaultSegment
			}
			if found == 0 {
				found = tt.now
			}
			f := facts{
				control:     session.Control{Now: at(tt.now), Blind: tt.blind},
				grace:       grace,
				sweepEvery:  sweepEvery,
				policy:      pol,
				spooling:    tt.spooling,
				braking:     tt.braking,
				othersAlive: tt.othersAlive,
			}
			to := timeout{
				Expired: session.Expired{UID: "u", Segment: segment, Deadline: at(tt.due), Detected: at(found),
					Stage: stage, Due: at(tt.due), Rechecked: tt.rechecked},
				claim: tt.claim,
				write: tt.write,
			}
			got := decide(f, to)
			if !sameVerdict(got, tt.want) {
				t.Errorf("verdict %s, want %s", show(got, t0), show(tt.want, t0))
			}
			if got.act == actClaim || got.act == actProduce || got.act == actSpool {
				if want := pol.Stages(segment)[stage-1]; got.stage != want {
					t.Errorf("says %+v, want stage %d's %+v", got.stage, stage, want)
				}
			}
			if l := lapse(f, to); l != tt.lapse {
				t.Errorf("lapse = %v, want %v", l, tt.lapse)
			}
			if a := brakeWouldHold(f, to); a != tt.asks {
				t.Errorf("asks the brake = %v, want %v", a, tt.asks)
			}
		})
	}
}

// TestHoldRulesHelp checks that the held metric's help names every rule.
func TestHoldRulesHelp(t *testing.T) {
	help := holdRulesHelp()
	for _, r := range []holdRule{ruleBlind, ruleGatewayDead, ruleFleetDown, ruleActivityLag, ruleBrake, ruleMinute, ruleRetry} {
		if !strings.Contains(help, string(r)+" (") {
			t.Errorf("help %q does not name rule %q", help, r)
		}
	}
}

func sameVerdict(a, b verdict) bool {
	return a.act == b.act && a.rule == b.rule && a.release.Equal(b.release) && a.reason == b.reason && a.next.Equal(b.next)
}

// show says v with its times as seconds after t0.
func show(v verdict, t0 time.Time) string {
	s := v.act.String()
	if v.rule != "" {
		s += fmt.Sprintf(" %s until %v", v.rule, v.release.Sub(t0))
	}
	if v.reason != "" {
		s += " " + string(v.reason)
	}
	switch {
	case v.next.Equal(session.AfterReplay):
		s += ", next after the replay"
	case !v.next.IsZero():
		s += fmt.Sprintf(", next at %v", v.next.Sub(t0))
	}
	return s
}
