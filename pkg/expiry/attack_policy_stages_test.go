package expiry

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackPolicyStagesChangedBetweenReminderAndClose: the operator
// changes the stages while silences are between their reminder and their
// close. Documented (README "Stages"): a stage's action and text come
// from the policy in force when it falls due, its delay from the one in
// force when the stage before went out, and a silence left at a stage its
// segment no longer has ends there with no event. So:
//
//   - "more": the close is pushed back behind a second reminder: stage 2
//     is now that reminder, due at the old close's time, and the close
//     comes after it, never before a reminder;
//   - "cut": the close is removed: no close, no further event, and the
//     user's entry leaves the index (no session held forever).
func TestAttackPolicyStagesChangedBetweenReminderAndClose(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	closeAfter := 4 * time.Second
	before := policy.Policy{
		DefaultTTL: 10 * time.Second,
		SegmentStages: map[string][]policy.Stage{
			"more": {{Action: timeoutevent.ActionRemind}, {After: closeAfter, Action: timeoutevent.ActionClose, Text: "Closed."}},
			"cut":  {{Action: timeoutevent.ActionRemind}, {After: closeAfter, Action: timeoutevent.ActionClose, Text: "Closed."}},
		},
	}
	h.savePolicy(before)
	cfg := h.config(ModeSweep)
	cfg.PolicyRefresh = 100 * time.Millisecond
	l, stop := h.startListener(cfg)
	defer stop()
	waitFor(t, waitLong, "the listener to apply the first policy", func() bool { return l.policy.Current().Equal(before) })

	more := h.renew("more", "more", 300*time.Millisecond)
	cut := h.renew("cut", "cut", 300*time.Millisecond)
	var closeDue time.Time
	waitFor(t, waitLong, "both reminders to go out", func() bool {
		s1, d1, ok1 := h.nextStage("more")
		s2, _, ok2 := h.nextStage("cut")
		closeDue = d1
		return ok1 && ok2 && s1 == 2 && s2 == 2
	})
	after := policy.Policy{
		DefaultTTL: 10 * time.Second,
		SegmentStages: map[string][]policy.Stage{
			"more": {
				{Action: timeoutevent.ActionRemind},
				{After: time.Second, Action: timeoutevent.ActionRemind, Text: "Still with us?"},
				{After: time.Second, Action: timeoutevent.ActionClose, Text: "Closed."},
			},
			"cut": {{Action: timeoutevent.ActionRemind}},
		},
	}
	h.savePolicy(after)
	waitFor(t, waitLong, "the listener to apply the changed policy", func() bool { return l.policy.Current().Equal(after) })
	if now := h.redisNow(); !now.Before(closeDue) {
		t.Skipf("the machine took %v past the old close's due time to apply the change: the test came too late", now.Sub(closeDue))
	}

	waitFor(t, waitLong, "more's three stages", func() bool { return len(byUID(h.events())["more"]) >= 3 })
	h.sweptPast(closeDue.Add(3 * time.Second))
	by := byUID(h.events())
	evs := by["more"]
	if len(evs) != 3 {
		t.Fatalf("more: %d events %+v, want reminder, reminder, close", len(evs), evs)
	}
	for i, want := range []string{"remind", "remind", "close"} {
		ev := evs[i]
		if ev.Stage != i+1 || ev.Action != want || ev.DeadlineMS != more.deadline.UnixMilli() {
			t.Fatalf("more stage %d: %+v, want %s of the silence at %d", i+1, ev, want, more.deadline.UnixMilli())
		}
	}
	if evs[0].Final || evs[1].Final || !evs[2].Final || evs[1].Text != "Still with us?" {
		t.Fatalf("more: finals %v %v %v, stage 2 text %q", evs[0].Final, evs[1].Final, evs[2].Final, evs[1].Text)
	}
	// Stage 2's delay is the old one, from when the reminder went out.
	if got := time.UnixMilli(evs[1].DueMS); !got.Equal(closeDue) {
		t.Fatalf("more stage 2 due %v, want the old close's due time %v", got, closeDue)
	}
	if evs[2].DueMS < evs[1].DueMS+time.Second.Milliseconds() {
		t.Fatalf("more close due %d, less than its new delay after the second reminder %d", evs[2].DueMS, evs[1].DueMS)
	}
	if evs := by["cut"]; len(evs) != 1 || evs[0].Stage != 1 || evs[0].Final || evs[0].DeadlineMS != cut.deadline.UnixMilli() {
		t.Fatalf("cut: %+v, want its reminder alone (final false: sent while a close followed)", evs)
	}
	if h.inIndex("cut") {
		t.Fatal("cut's silence ended at a stage its segment no longer has, but its entry stays in the index")
	}
	if _, _, ok := h.nextStage("cut"); ok {
		t.Fatal("cut still has a stage entry")
	}
}
