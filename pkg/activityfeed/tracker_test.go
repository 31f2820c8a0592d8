package activityfeed

import (
	"maps"
	"testing"
	"time"
)

func TestTracker(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		assign, revoke []int32
		applied        map[int32]int64
		at             int // a checkpoint at this time, with ends
		ends           map[int32]int64
		want           map[int32]int // caughtUp after the step, by time
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"an idle partition catches up at each checkpoint", []step{
			{assign: []int32{0}, applied: map[int32]int64{0: 5}},
			{at: 100, ends: map[int32]int64{0: 5}, want: map[int32]int{0: 100}},
			{at: 200, ends: map[int32]int64{0: 5}, want: map[int32]int{0: 200}},
		}},
		{"a busy partition catches up to the checkpoint it passed", []step{
			{assign: []int32{0}, applied: map[int32]int64{0: 0}},
			{at: 100, ends: map[int32]int64{0: 10}, want: map[int32]int{}},
			{at: 200, ends: map[int32]int64{0: 20}, want: map[int32]int{}},
			{applied: map[int32]int64{0: 15}, want: map[int32]int{0: 100}},
			{applied: map[int32]int64{0: 20}, want: map[int32]int{0: 200}},
			{applied: map[int32]int64{0: 25}, want: map[int32]int{}},
		}},
		{"an unknown position passes nothing until it is known", []step{
			{assign: []int32{0}},
			{at: 100, ends: map[int32]int64{0: 0}, want: map[int32]int{}},
			{applied: map[int32]int64{0: 0}, want: map[int32]int{0: 100}},
		}},
		{"a position never moves back", []step{
			{assign: []int32{0}, applied: map[int32]int64{0: 10}},
			{applied: map[int32]int64{0: 3}},
			{at: 100, ends: map[int32]int64{0: 10}, want: map[int32]int{0: 100}},
		}},
		{"a revoked partition is not stamped", []step{
			{assign: []int32{0, 1}, applied: map[int32]int64{0: 1, 1: 1}},
			{revoke: []int32{1}, at: 100, ends: map[int32]int64{0: 1, 1: 1}, want: map[int32]int{0: 100}},
		}},
		{"a partition not owned is not stamped", []step{
			{assign: []int32{0}, applied: map[int32]int64{0: 1, 2: 9}},
			{at: 100, ends: map[int32]int64{0: 1, 2: 1}, want: map[int32]int{0: 100}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTracker()
			for i, s := range tt.steps {
				for _, p := range s.assign {
					tr.assign(p)
				}
				for _, p := range s.revoke {
					tr.revoke(p)
				}
				for p, n := range s.applied {
					tr.applied(p, n)
				}
				if s.ends != nil {
					tr.checkpoint(at(s.at), s.ends)
				}
				got := tr.caughtUp()
				if s.want == nil {
					continue
				}
				want := map[int32]time.Time{}
				for p, ms := range s.want {
					want[p] = at(ms)
				}
				if !maps.EqualFunc(got, want, time.Time.Equal) {
					t.Fatalf("step %d: caught up %v, want %v", i, got, want)
				}
			}
		})
	}
}

// TestTrackerBoundsPending checks that a partition lagging for long keeps
// at most maxPending checkpoints, and that dropping the oldest only
// delays its watermark.
func TestTrackerBoundsPending(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	tr := newTracker()
	tr.assign(0)
	tr.applied(0, 0)
	for i := range 10 * maxPending {
		tr.checkpoint(t0.Add(time.Duration(i)*time.Millisecond), map[int32]int64{0: int64(i + 1)})
	}
	if n := len(tr.parts[0].pending); n != maxPending {
		t.Fatalf("%d checkpoints kept, want %d", n, maxPending)
	}
	tr.applied(0, 1) // past the dropped first checkpoint only
	if got := tr.caughtUp(); len(got) != 0 {
		t.Fatalf("caught up %v through a dropped checkpoint", got)
	}
	tr.applied(0, int64(10*maxPending))
	if got := tr.caughtUp()[0]; !got.Equal(t0.Add(time.Duration(10*maxPending-1) * time.Millisecond)) {
		t.Fatalf("caught up at %v, want the last checkpoint's time", got)
	}
}
