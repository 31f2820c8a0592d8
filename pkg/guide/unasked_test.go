package guide

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

func TestUnaskedCloses(t *testing.T) {
	d := time.UnixMilli(1_796_000_000_000)
	remind := timeoutevent.New("u1", "default", d, d, timeoutevent.SourceSweep)
	second := remind.AtStage(2, d.Add(time.Minute), timeoutevent.ActionRemind, "Still there?", false)
	closing := remind.AtStage(3, d.Add(2*time.Minute), timeoutevent.ActionClose, "Closed.", true)
	notify := remind.AtStage(2, d.Add(time.Minute), timeoutevent.ActionNotify, "", false)
	next := timeoutevent.New("u1", "default", d.Add(time.Hour), d.Add(time.Hour), timeoutevent.SourceSweep)
	nextClose := next.AtStage(2, d.Add(time.Hour+time.Minute), timeoutevent.ActionClose, "Closed.", true)
	other := timeoutevent.New("u2", "default", d, d, timeoutevent.SourceSweep)
	otherClose := other.AtStage(2, d.Add(time.Minute), timeoutevent.ActionClose, "Closed.", true)
	type settle struct {
		ev      timeoutevent.Event
		outcome Outcome
	}
	for _, tc := range []struct {
		name    string
		settled []settle
		close   timeoutevent.Event
		want    bool
	}{
		{"nothing settled", nil, closing, false},
		{"reminder delivered", []settle{{remind, OutcomeDelivered}}, closing, false},
		{"reminder too old", []settle{{remind, OutcomeTooOld}}, closing, true},
		{"reminder too old, a later one delivered", []settle{{remind, OutcomeTooOld}, {second, OutcomeDelivered}}, closing, false},
		{"reminder too old, a later one kept", []settle{{remind, OutcomeTooOld}, {second, OutcomeQueued}}, closing, false},
		{"reminder too old, a later one a duplicate", []settle{{remind, OutcomeTooOld}, {second, OutcomeDuplicate}}, closing, false},
		{"both reminders too old", []settle{{remind, OutcomeTooOld}, {second, OutcomeTooOld}}, closing, true},
		{"reminder too old, a notify delivered", []settle{{remind, OutcomeTooOld}, {notify, OutcomeDelivered}}, closing, true},
		{"reminder stale", []settle{{remind, OutcomeStale}}, closing, false},
		{"an earlier silence's reminder too old", []settle{{remind, OutcomeTooOld}}, nextClose, false},
		{"another user's reminder too old", []settle{{other, OutcomeTooOld}}, closing, false},
		{"its own user's", []settle{{other, OutcomeTooOld}}, otherClose, true},
		{"not a close", []settle{{remind, OutcomeTooOld}}, second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var u unasked
			for _, s := range tc.settled {
				u.settled(s.ev, s.outcome)
			}
			if got := u.closes(tc.close); got != tc.want {
				t.Errorf("closes(stage %d %s of deadline %d) = %v, want %v", tc.close.Stage, tc.close.Action, tc.close.DeadlineMS, got, tc.want)
			}
		})
	}
}

func TestUnaskedPrune(t *testing.T) {
	var u unasked
	u.m = map[string]unaskedSilence{}
	now := time.Now()
	u.m["old"] = unaskedSilence{deadlineMS: 1, added: now.Add(-unaskedKeep - time.Minute)}
	u.m["new"] = unaskedSilence{deadlineMS: 1, added: now}
	u.prune(now)
	if _, ok := u.m["old"]; ok {
		t.Error("an entry older than unaskedKeep was kept")
	}
	if _, ok := u.m["new"]; !ok {
		t.Error("a young entry was pruned while under the bound")
	}
}
