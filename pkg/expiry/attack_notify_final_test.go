package expiry

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackPolicyShrinkLeavesNoFinal breaks the final/reason contract of
// the platform's webhooks (docs/protocol.md, "Guide webhook": "final:
// true on the silence's last stage: no further request of that silence
// follows"; "Notify webhook"; the issue: "Final stages carry a reason
// (inactive, ended, notify) so the platform can act"). The reason is
// decided when a stage is produced, from the policy in force then; the
// silence is ended by the policy in force when the next stage falls due.
// An operator shortens a segment's stages (here from two reminders to
// one) while a user is between them: stage 1 went out not final, and
// stage 2 is settled as stage-gone, without an event. That silence's
// last request was not final and none follows: a platform that acts on
// final (mark the user away, free the agent, as reason inactive says)
// waits for it forever.
func TestAttackPolicyShrinkLeavesNoFinal(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	two := policy.Policy{
		DefaultTTL: 10 * time.Second,
		SegmentStages: map[string][]policy.Stage{"default": {
			{Action: timeoutevent.ActionRemind},
			// Room to store the shorter policy, and for the listener to
			// read it, before this stage falls due.
			{After: 3 * time.Second, Action: timeoutevent.ActionRemind, Text: "Still with us?"},
		}},
	}
	h.savePolicy(two)
	cfg := h.config(ModeSweep)
	cfg.PolicyRefresh = 100 * time.Millisecond
	l, stop := h.startListener(cfg)
	defer stop()

	h.renew("shrunk", "default", 300*time.Millisecond)
	var due2 time.Time
	waitFor(t, waitLong, "stage 1 to go out", func() bool {
		stage, due, ok := h.nextStage("shrunk")
		due2 = due
		return ok && stage == 2
	})
	one := two
	one.SegmentStages = map[string][]policy.Stage{"default": two.SegmentStages["default"][:1]}
	h.savePolicy(one)
	waitFor(t, waitLong, "the listener to apply the one-stage policy", func() bool {
		return len(l.policy.Current().Stages("default")) == 1
	})
	if now := h.redisNow(); !now.Before(due2) {
		t.Fatalf("stage 2 fell due at %v, before the shorter policy applied (now %v): the test did not set up the case", due2, now)
	}
	h.sweptPast(due2.Add(100 * time.Millisecond))
	h.waitSettled([]string{"shrunk"})

	evs := byUID(h.events())["shrunk"]
	if len(evs) == 0 {
		t.Fatal("no event for shrunk")
	}
	last := evs[len(evs)-1]
	if !last.Last() {
		t.Errorf("shrunk's silence is over, its last event %+v (stage %d; %d events) not final, no reason: "+
			"the platform never hears that the silence ended", last, last.Stage, len(evs))
	}
}
