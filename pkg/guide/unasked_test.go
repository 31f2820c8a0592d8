package guide

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
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
		{"first reminder delivered, second too old", []settle{{remind, OutcomeDelivered}, {second, OutcomeTooOld}}, closing, false},
		{"reminder too old, the close settled, a resent close", []settle{{remind, OutcomeTooOld}, {closing, OutcomeTooOld}}, closing, false},
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

func TestMayHaveShown(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"a timeout", context.DeadlineExceeded, true},
		{"a connection reset mid-request", fmt.Errorf("push guide g1: %w", io.ErrUnexpectedEOF), true},
		{"no connection made", fmt.Errorf("push guide g1: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), false},
		{"a gateway's 503", fmt.Errorf("push guide g1: %w", &push.Error{Status: push.Retry, Code: 503}), false},
		{"a gateway's 409: another push under way", &push.Error{Status: push.Retry, Code: 409}, true},
		{"a gateway's 200 this build cannot read", &push.Error{Status: push.Retry, Code: 200}, true},
		{"a guide refused before it left", &push.Error{Status: push.Rejected}, false},
		{"a webhook's 503", fmt.Errorf("webhook guide g1: %w", answerError("503 Service Unavailable")), false},
	} {
		if got := mayHaveShown(tc.err); got != tc.want {
			t.Errorf("%s: mayHaveShown(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestUnaskedMayHaveAsked(t *testing.T) {
	d := time.UnixMilli(1_796_000_000_000)
	remind := timeoutevent.New("u1", "default", d, d, timeoutevent.SourceSweep)
	second := remind.AtStage(2, d.Add(time.Minute), timeoutevent.ActionRemind, "Still there?", false)
	closing := remind.AtStage(3, d.Add(2*time.Minute), timeoutevent.ActionClose, "Closed.", true)
	var u unasked
	u.settled(remind, OutcomeTooOld)
	u.mayHaveAsked(second)
	if u.closes(closing) {
		t.Error("a close dropped after a later reminder of its silence may have been shown")
	}
}
