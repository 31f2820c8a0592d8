package session

import (
	"context"
	"testing"
	"time"
)

// dueOne sweeps until uid is due, or fails after within.
func dueOne(t *testing.T, s *Store, uid string, within time.Duration, sweep func(context.Context) ([]Expired, error)) Expired {
	t.Helper()
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		got, err := sweep(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range got {
			if e.UID == uid {
				return e
			}
		}
	}
	t.Fatalf("%s not due within %v", uid, within)
	return Expired{}
}

func sweepAll(s *Store) func(context.Context) ([]Expired, error) {
	return func(ctx context.Context) ([]Expired, error) {
		got, _, err := s.Due(ctx, 100)
		return got, err
	}
}

// TestStagesInTheIndex: a settled stage with a next one stays in the
// index, due then for that stage, with the silence's deadline; the last
// stage's entry goes; a renewal drops the stages left, so the next
// silence starts at stage 1; keyspace-event listeners find later stages
// through Released, and a late event does not bring a stage forward.
func TestStagesInTheIndex(t *testing.T) {
	s, ctx := newStore(t)
	deadline, err := s.Renew(ctx, "ann", DefaultSegment, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	first := dueOne(t, s, "ann", 2*time.Second, sweepAll(s))
	if first.Stage != 1 || !first.Due.Equal(deadline) || !first.Deadline.Equal(deadline) {
		t.Fatalf("stage 1: %+v, want due and deadline %v", first, deadline)
	}
	first.NextDue = first.Due.Add(300 * time.Millisecond)
	if err := s.Settle(ctx, []Expired{first}); err != nil {
		t.Fatal(err)
	}
	// Not due before its time, from a sweep or a late expired event.
	if got, _, _ := s.Due(ctx, 100); len(got) != 0 {
		t.Fatalf("due before stage 2's time: %+v", got)
	}
	if _, ok, err := s.Lookup(ctx, "ann"); ok || err != nil {
		t.Fatalf("Lookup before stage 2's time: ok %v, %v", ok, err)
	}
	second := dueOne(t, s, "ann", 2*time.Second, sweepAll(s))
	if second.Stage != 2 || !second.Due.Equal(first.NextDue) || !second.Deadline.Equal(deadline) || second.Segment != DefaultSegment {
		t.Fatalf("stage 2: %+v, want due %v, deadline %v", second, first.NextDue, deadline)
	}
	// A settle of stage 1 again (a retry) changes nothing now.
	if err := s.Settle(ctx, []Expired{first}); err != nil {
		t.Fatal(err)
	}
	if got := dueOne(t, s, "ann", time.Second, sweepAll(s)); got.Stage != 2 {
		t.Fatalf("after a repeated settle of stage 1: %+v", got)
	}
	second.NextDue = second.Due.Add(200 * time.Millisecond)
	if err := s.Settle(ctx, []Expired{second}); err != nil {
		t.Fatal(err)
	}
	// A keyspace-event listener finds the third stage too.
	third := dueOne(t, s, "ann", 2*time.Second, func(ctx context.Context) ([]Expired, error) { return s.Released(ctx, 100) })
	if third.Stage != 3 || !third.Deadline.Equal(deadline) {
		t.Fatalf("stage 3 from Released: %+v", third)
	}
	// The last stage's entry goes.
	if err := s.Settle(ctx, []Expired{third}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if got, _, _ := s.Due(ctx, 100); len(got) != 0 {
		t.Fatalf("after the last stage: %+v", got)
	}

	// A renewal between stages drops the rest: the next silence starts
	// at stage 1.
	if _, err := s.Renew(ctx, "bob", DefaultSegment, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	b1 := dueOne(t, s, "bob", 2*time.Second, sweepAll(s))
	b1.NextDue = b1.Due.Add(200 * time.Millisecond)
	if err := s.Settle(ctx, []Expired{b1}); err != nil {
		t.Fatal(err)
	}
	back, err := s.Renew(ctx, "bob", DefaultSegment, 400*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	again := dueOne(t, s, "bob", 2*time.Second, sweepAll(s))
	if again.Stage != 1 || !again.Deadline.Equal(back) {
		t.Fatalf("silence after coming back: %+v, want stage 1 at %v", again, back)
	}
	if time.Now().Before(back) {
		t.Fatal("due before the new deadline")
	}
	// An end between stages drops them too.
	again.NextDue = again.Due.Add(100 * time.Millisecond)
	if err := s.Settle(ctx, []Expired{again}); err != nil {
		t.Fatal(err)
	}
	if err := s.End(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if got, _, _ := s.Due(ctx, 100); len(got) != 0 {
		t.Fatalf("after an end between stages: %+v", got)
	}
	if n, _ := s.rdb.HLen(ctx, s.ks.StageKey(Bucket("bob"))).Result(); n != 0 {
		t.Fatalf("stage hash holds %d entries after the end", n)
	}
}

// TestHeldStageKeepsItsStage: a later stage held in an outage comes back
// as that stage, checked once.
func TestHeldStageKeepsItsStage(t *testing.T) {
	s, ctx := newStore(t)
	deadline, err := s.Renew(ctx, "cid", DefaultSegment, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	e := dueOne(t, s, "cid", 2*time.Second, sweepAll(s))
	e.NextDue = e.Due.Add(100 * time.Millisecond)
	if err := s.Settle(ctx, []Expired{e}); err != nil {
		t.Fatal(err)
	}
	two := dueOne(t, s, "cid", 2*time.Second, sweepAll(s))
	_, now, _ := s.Due(ctx, 100)
	if n, err := s.Hold(ctx, []Expired{two}, now.Add(200*time.Millisecond)); err != nil || n != 1 {
		t.Fatalf("Hold = %d, %v", n, err)
	}
	back := dueOne(t, s, "cid", 2*time.Second, sweepAll(s))
	if back.Stage != 2 || !back.Rechecked || !back.Due.Equal(two.Due) || !back.Deadline.Equal(deadline) {
		t.Fatalf("released: %+v, want stage 2 rechecked, due %v", back, two.Due)
	}
}
