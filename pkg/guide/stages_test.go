package guide

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// produceEvent writes ev to the partition its uid hashes to.
func (e *testEnv) produceEvent(ev timeoutevent.Event) produced {
	e.t.Helper()
	b, err := ev.Marshal()
	if err != nil {
		e.t.Fatal(err)
	}
	p := partitionOf(ev.UID)
	return produced{ev: ev, partition: p, offset: e.produceRaw(p, ev.UID, b)}
}

// histogramOf reads a histogram's sample count and sum; labels are
// name, value pairs. Missing reads as 0, 0.
func histogramOf(t *testing.T, name string, labels ...string) (uint64, float64) {
	t.Helper()
	h := gathered(t, name, labels...).GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

func stageGuides(t *testing.T, stage, action string) float64 {
	return metricValue(t, "stillthere_consumer_stage_guides_total", "stage", stage, "action", action)
}

// TestStagesSent: every stage of a silence is sent with its stage, action
// and final, and with its own text from the policy, or the segment's when
// the policy gives none. A later stage's age counts from when it was due,
// not from the deadline, and so does its lateness; a later stage whose
// user renewed after the deadline is stale.
func TestStagesSent(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.GuideTemplates = "vip=Still with us?"
	ctx := context.Background()
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	now = now.Truncate(time.Millisecond)
	const closeText = "We haven't heard from you, so we closed this chat."

	// silent: reminded at the deadline, closed 3 minutes later, due now.
	d := now.Add(-3*time.Minute - time.Second)
	first := timeoutevent.New("silent", session.DefaultSegment, d, d.Add(50*time.Millisecond), timeoutevent.SourceSweep)
	closing := first.AtStage(2, d.Add(3*time.Minute), timeoutevent.ActionClose, closeText, true)
	// slow: the third reminder of a policy with long delays, due now, its
	// deadline older than the guide max age.
	ds := now.Add(-e.cfg.GuideMaxAge - 5*time.Minute)
	third := timeoutevent.New("slow", "vip", ds, ds, timeoutevent.SourceSweep).
		AtStage(3, now.Add(-time.Second), timeoutevent.ActionRemind, "", false)
	// back: renewed after the deadline and went silent again; the second
	// stage of the silence that is over is stale.
	db := now.Add(-2 * time.Second)
	if _, err := e.store.Renew(ctx, "back", session.DefaultSegment, 50*time.Millisecond, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "back's new session to run out", func() bool { return e.rdb.Exists(ctx, e.store.Keyspace().SessionKey("back")).Val() == 0 })
	over := timeoutevent.New("back", session.DefaultSegment, db, db, timeoutevent.SourceSweep).
		AtStage(2, now, timeoutevent.ActionRemind, "", false)

	remind1, remind3, close2 := stageGuides(t, "1", "remind"), stageGuides(t, "3", "remind"), stageGuides(t, "2", "close")
	stale0, tooOld0 := guidesSettled(t, OutcomeStale), guidesSettled(t, OutcomeTooOld)
	late0, lateSum0 := histogramOf(t, "stillthere_consumer_deadline_to_delivery_seconds", "stage", "2")
	for _, ev := range []timeoutevent.Event{first, closing, third, over} {
		e.produceEvent(ev)
	}
	e.start(cfg)
	e.waitCommittedToEnd(cfg.Group)

	want := map[string]push.Request{
		first.ID:   {ID: first.ID, UID: "silent", Segment: session.DefaultSegment, Text: testText, DeadlineMS: d.UnixMilli(), DueMS: first.DueMS, DetectedMS: first.DetectedMS, Stage: 1, Action: "remind"},
		closing.ID: {ID: closing.ID, UID: "silent", Segment: session.DefaultSegment, Text: closeText, DeadlineMS: d.UnixMilli(), DueMS: closing.DueMS, DetectedMS: closing.DetectedMS, Stage: 2, Action: "close", Final: true, Reason: "ended"},
		third.ID:   {ID: third.ID, UID: "slow", Segment: "vip", Text: "Still with us?", DeadlineMS: ds.UnixMilli(), DueMS: third.DueMS, DetectedMS: third.DetectedMS, Stage: 3, Action: "remind"},
	}
	for id, w := range want {
		if got, ok := e.gw.Get(id); !ok || got.Request != w {
			t.Errorf("pushed %+v (sent %v), want %+v", got.Request, ok, w)
		}
	}
	if n := e.gw.Attempts(over.ID); n != 0 {
		t.Errorf("the later stage of a silence that is over was pushed %d times", n)
	}
	if d := guidesSettled(t, OutcomeStale) - stale0; d != 1 {
		t.Errorf("stale outcomes: %v, want 1", d)
	}
	if d := guidesSettled(t, OutcomeTooOld) - tooOld0; d != 0 {
		t.Errorf("too_old outcomes: %v, want 0: a stage's age counts from when it was due", d)
	}
	for _, c := range []struct {
		stage, action string
		before        float64
	}{{"1", "remind", remind1}, {"3", "remind", remind3}, {"2", "close", close2}} {
		if d := stageGuides(t, c.stage, c.action) - c.before; d != 1 {
			t.Errorf("stage %s %s guides: %v more, want 1", c.stage, c.action, d)
		}
	}
	// Stage 2 was due a second before it was produced, its deadline
	// three minutes before that: its lateness is the second.
	late, lateSum := histogramOf(t, "stillthere_consumer_deadline_to_delivery_seconds", "stage", "2")
	if late-late0 != 1 || lateSum-lateSum0 > 30 {
		t.Errorf("stage 2 lateness: %d samples of %.1fs in all, want 1 of a few seconds", late-late0, lateSum-lateSum0)
	}
}

// TestNeedlessStages: a later stage is stale once its user renewed after
// the silence's deadline, even before the stage was due, and too old only
// past the max age from when it was due.
func TestNeedlessStages(t *testing.T) {
	const maxAge = 5 * time.Minute
	now := time.UnixMilli(1_795_255_600_123)
	tests := []struct {
		name     string
		deadline time.Duration // before now
		due      time.Duration // before now
		renewed  time.Duration // before now; 0 never
		want     Outcome
	}{
		{"due now, deadline past the max age", 10 * time.Minute, 0, 0, ""},
		{"due past the max age", 20 * time.Minute, maxAge + time.Second, 0, OutcomeTooOld},
		{"renewed between the deadline and the stage", 3 * time.Minute, 0, time.Minute, OutcomeStale},
		{"renewed before the deadline", 3 * time.Minute, 0, 4 * time.Minute, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := now.Add(-tt.deadline)
			ev := timeoutevent.New("u", session.DefaultSegment, d, d, timeoutevent.SourceSweep).
				AtStage(2, now.Add(-tt.due), timeoutevent.ActionRemind, "", false)
			s := sessionCheck{now: now}
			if tt.renewed > 0 {
				s.renewed = now.Add(-tt.renewed)
			}
			if got := needless(ev, s, maxAge); got != tt.want {
				t.Errorf("needless = %q, want %q", got, tt.want)
			}
		})
	}
}
