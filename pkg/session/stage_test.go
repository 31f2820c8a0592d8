package session

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// dueOne sweeps until uid is due, or fails after within.
func dueOne(t *testing.T, s *Store, uid string, within time.Duration, sweep func(context.Context) ([]Expired, error)) Expired {
	t.Helper()
	var found Expired
	eventually(t, within, uid+" due", func() bool {
		got, err := sweep(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range got {
			if e.UID == uid {
				found = e
				return true
			}
		}
		return false
	})
	return found
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
	deadline, err := s.Renew(ctx, "ann", DefaultSegment, 100*time.Millisecond, ClockPresence)
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
	// The last stage's entry goes: not due later, not in the index at all.
	if err := s.Settle(ctx, []Expired{third}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.Due(ctx, 100); len(got) != 0 {
		t.Fatalf("after the last stage: %+v", got)
	}
	if err := s.rdb.ZScore(ctx, s.ks.IndexKey(Bucket("ann")), "ann").Err(); err != redis.Nil {
		t.Fatalf("after the last stage: ann's index entry is still there (%v)", err)
	}

	// A renewal between stages drops the rest: the next silence starts
	// at stage 1.
	if _, err := s.Renew(ctx, "bob", DefaultSegment, 50*time.Millisecond, ClockPresence); err != nil {
		t.Fatal(err)
	}
	b1 := dueOne(t, s, "bob", 2*time.Second, sweepAll(s))
	b1.NextDue = b1.Due.Add(200 * time.Millisecond)
	if err := s.Settle(ctx, []Expired{b1}); err != nil {
		t.Fatal(err)
	}
	back, err := s.Renew(ctx, "bob", DefaultSegment, 400*time.Millisecond, ClockPresence)
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
	// Past the dropped stage's due time: it would be due now.
	redisPast(t, s.rdb, again.NextDue)
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
	deadline, err := s.Renew(ctx, "cid", DefaultSegment, 50*time.Millisecond, ClockPresence)
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

// TestStageAfterSpoolWaitsForReplay: a stage settled as spooled leaves
// the next one in the index due for no sweep, until the replay follows
// it: then it is due its delay after the replay. A replay that comes
// before the stage's settle (a replayer quicker than the sweep that
// spooled, or a crash between spooling and settling) settles it itself,
// and the late settle leaves the entry alone. A renewal ends a silence
// waiting for its replay. A next stage the policy lost is due at once.
func TestStageAfterSpoolWaitsForReplay(t *testing.T) {
	s, ctx := newStore(t)
	score := func(uid string) float64 {
		t.Helper()
		v, err := s.rdb.ZScore(ctx, s.ks.IndexKey(Bucket(uid)), uid).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	const delay = 200 * time.Millisecond
	follow := func(e Expired, next time.Duration) time.Time {
		t.Helper()
		_, before, err := s.Due(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.FollowReplayed(ctx, []Replayed{{UID: e.UID, Stage: e.Stage, Deadline: e.Deadline, Due: e.Due, Next: next}}); err != nil {
			t.Fatal(err)
		}
		return before.Add(next)
	}

	// Spooled, then replayed.
	if _, err := s.Renew(ctx, "ann", DefaultSegment, 50*time.Millisecond, ClockPresence); err != nil {
		t.Fatal(err)
	}
	a1 := dueOne(t, s, "ann", 2*time.Second, sweepAll(s))
	a1.NextDue = AfterReplay
	if err := s.Settle(ctx, []Expired{a1}); err != nil {
		t.Fatal(err)
	}
	if got := score("ann"); got != float64(AfterReplay.UnixMilli()) {
		t.Fatalf("stage 2 after a spooled stage 1 is due at %v, want it waiting (%d)", got, AfterReplay.UnixMilli())
	}
	if got, _ := s.Released(ctx, 100); len(got) != 0 {
		t.Fatalf("Released found %+v while stage 1 waits in a spool", got)
	}
	if _, ok, err := s.Lookup(ctx, "ann"); ok || err != nil {
		t.Fatalf("Lookup while stage 1 waits in a spool: ok %v, %v", ok, err)
	}
	from := follow(a1, delay)
	a2 := dueOne(t, s, "ann", 2*time.Second, sweepAll(s))
	if a2.Stage != 2 || !a2.Deadline.Equal(a1.Deadline) || a2.Due.Before(from) {
		t.Fatalf("stage 2 after the replay: %+v, want due at %v or later", a2, from)
	}
	// A replay again (a retry, or a crash before the spool's commit)
	// after the stage went out changes nothing.
	a2.NextDue = time.Time{}
	if err := s.Settle(ctx, []Expired{a2}); err != nil {
		t.Fatal(err)
	}
	follow(a1, delay)
	if n, _ := s.rdb.ZCard(ctx, s.ks.IndexKey(Bucket("ann"))).Result(); n != 0 {
		t.Fatalf("index holds %d entries after the last stage and a second replay", n)
	}

	// Replayed before its settle: the replay settles it, and the late
	// settle as spooled does not make the next stage wait again.
	if _, err := s.Renew(ctx, "bob", DefaultSegment, 50*time.Millisecond, ClockPresence); err != nil {
		t.Fatal(err)
	}
	b1 := dueOne(t, s, "bob", 2*time.Second, sweepAll(s))
	from = follow(b1, delay)
	b1.NextDue = AfterReplay
	if err := s.Settle(ctx, []Expired{b1}); err != nil {
		t.Fatal(err)
	}
	if got := score("bob"); got >= float64(AfterReplay.UnixMilli()) {
		t.Fatal("stage 2 waits for a replay that came already")
	}
	if b2 := dueOne(t, s, "bob", 2*time.Second, sweepAll(s)); b2.Stage != 2 || b2.Due.Before(from) {
		t.Fatalf("stage 2 after a replay before the settle: %+v, want due at %v or later", b2, from)
	}

	// Back before the replay: the silence is over, and the replay of its
	// stage 1 starts no stage 2.
	if _, err := s.Renew(ctx, "cid", DefaultSegment, 50*time.Millisecond, ClockPresence); err != nil {
		t.Fatal(err)
	}
	c1 := dueOne(t, s, "cid", 2*time.Second, sweepAll(s))
	c1.NextDue = AfterReplay
	if err := s.Settle(ctx, []Expired{c1}); err != nil {
		t.Fatal(err)
	}
	back, err := s.Renew(ctx, "cid", DefaultSegment, time.Hour, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	follow(c1, 0)
	if got := score("cid"); got != float64(back.UnixMilli()) {
		t.Fatalf("index holds %v for a user who came back, want their new deadline %d", got, back.UnixMilli())
	}
	if n, _ := s.rdb.HLen(ctx, s.ks.StageKey(Bucket("cid"))).Result(); n != 0 {
		t.Fatalf("stage hash holds %d entries after the user came back", n)
	}

	// A next stage the policy no longer has: due at once, for the
	// listener to end the silence there.
	if _, err := s.Renew(ctx, "dan", DefaultSegment, 50*time.Millisecond, ClockPresence); err != nil {
		t.Fatal(err)
	}
	d1 := dueOne(t, s, "dan", 2*time.Second, sweepAll(s))
	d1.NextDue = AfterReplay
	if err := s.Settle(ctx, []Expired{d1}); err != nil {
		t.Fatal(err)
	}
	follow(d1, 0)
	if d2 := dueOne(t, s, "dan", 2*time.Second, sweepAll(s)); d2.Stage != 2 {
		t.Fatalf("after a replay with no next stage: %+v, want stage 2 due", d2)
	}
}

// TestSpooledDedupMark: a spooled timeout's dedup mark tells a replica
// that finds its entry again that it is spooled (not produced), and the
// consumer can mark it stale once replayed; another silence in its
// window is deferred, as after a produced one.
func TestSpooledDedupMark(t *testing.T) {
	s, ctx := newStore(t)
	deadline := time.Now().Truncate(time.Minute).Add(time.Minute + 10*time.Second)
	e := Expired{UID: "eve", Stage: 1, Deadline: deadline, Due: deadline}
	claim := func(e Expired) string {
		t.Helper()
		replies, errs := s.ClaimTimeouts(ctx, []Expired{e}, "claimed:me", time.Minute)
		if errs[0] != nil {
			t.Fatal(errs[0])
		}
		out, _ := ParseClaim(replies[0])
		return out
	}
	key := s.ks.StageDedupKey(e.UID, e.Stage, e.Due)
	if err := s.rdb.Set(ctx, key, DedupSpooled(deadline), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if got := claim(e); got != ClaimSpooled {
		t.Fatalf("claim of a spooled timeout: %q, want %q", got, ClaimSpooled)
	}
	other := e
	other.Deadline = deadline.Add(20 * time.Second)
	other.Due = other.Deadline
	if got := claim(other); got != ClaimDefer {
		t.Fatalf("claim of another silence in the window of a spooled one: %q, want %q", got, ClaimDefer)
	}
	if err := s.MarkStale(ctx, e.UID, e.Stage, e.Due, e.Deadline); err != nil {
		t.Fatal(err)
	}
	if got := claim(other); got != ClaimFresh {
		t.Fatalf("claim of another silence after the spooled one was stale: %q, want %q", got, ClaimFresh)
	}
}
