package session

import (
	"testing"
	"time"
)

// TestCloseAppliedAt: a close decided applied keeps when, by Redis's
// clock, and a later commit (another connection told the same) leaves
// that time as it was; a cancelled or undecided close has none. ApplyClose
// applies whatever the user did since, keeping the time too, and leaves
// a cancellation as it was.
func TestCloseAppliedAt(t *testing.T) {
	s, ctx := newStore(t)
	deadline := redisNow(t, s.rdb).Add(-time.Minute).UnixMilli()

	before := redisNow(t, s.rdb).UnixMilli()
	if applied, err := s.CommitClose(ctx, "closeat-a", "c", deadline, time.Minute); err != nil || !applied {
		t.Fatalf("commit: applied %v, %v", applied, err)
	}
	after := redisNow(t, s.rdb).UnixMilli()
	at, err := s.CloseAppliedAt(ctx, "closeat-a", "c")
	if err != nil || at < before || at > after {
		t.Fatalf("applied at %d, %v; want within [%d, %d]", at, err, before, after)
	}
	redisPast(t, s.rdb, time.UnixMilli(after))
	if applied, err := s.CommitClose(ctx, "closeat-a", "c", deadline, time.Minute); err != nil || !applied {
		t.Fatalf("second commit: applied %v, %v", applied, err)
	}
	if again, err := s.CloseAppliedAt(ctx, "closeat-a", "c"); err != nil || again != at {
		t.Errorf("after a second commit: applied at %d, %v; want %d, the decision's", again, err, at)
	}

	if _, err := s.Renew(ctx, "closeat-b", "default", time.Minute, ClockPresence); err != nil {
		t.Fatal(err)
	}
	if applied, err := s.CommitClose(ctx, "closeat-b", "c", deadline, time.Minute); err != nil || applied {
		t.Fatalf("commit after a renewal: applied %v, %v; want cancelled", applied, err)
	}
	for _, uid := range []string{"closeat-b", "closeat-none"} {
		if at, err := s.CloseAppliedAt(ctx, uid, "c"); err != nil || at != 0 {
			t.Errorf("%s: applied at %d, %v; want 0", uid, at, err)
		}
	}

	before = redisNow(t, s.rdb).UnixMilli()
	if applied, err := s.ApplyClose(ctx, "closeat-b", "c2", time.Minute); err != nil || !applied {
		t.Fatalf("apply after a renewal: applied %v, %v", applied, err)
	}
	if at, err := s.CloseAppliedAt(ctx, "closeat-b", "c2"); err != nil || at < before || at > redisNow(t, s.rdb).UnixMilli() {
		t.Errorf("applied by ApplyClose at %d, %v; want from %d to now", at, err, before)
	}
	if applied, err := s.ApplyClose(ctx, "closeat-b", "c", time.Minute); err != nil || applied {
		t.Errorf("apply of a cancelled close: applied %v, %v; want it left cancelled", applied, err)
	}
}

// TestCommitCloseAtBringsTheTime: the decision answers with when the
// close was applied, the time CloseAppliedAt reads, whether it decided
// now or a commit before it did; a cancelled close, or one decided by a
// release that kept no time, answers 0.
func TestCommitCloseAtBringsTheTime(t *testing.T) {
	s, ctx := newStore(t)
	deadline := redisNow(t, s.rdb).Add(-time.Minute).UnixMilli()

	applied, at, err := s.CommitCloseAt(ctx, "cca-a", "c", deadline, time.Minute)
	if err != nil || !applied || at <= 0 {
		t.Fatalf("first commit: applied %v at %d, %v", applied, at, err)
	}
	if kept, err := s.CloseAppliedAt(ctx, "cca-a", "c"); err != nil || kept != at {
		t.Fatalf("kept %d, %v; the decision answered %d", kept, err, at)
	}
	redisPast(t, s.rdb, time.UnixMilli(at))
	for _, commit := range []func() (bool, int64, error){
		func() (bool, int64, error) { return s.CommitCloseAt(ctx, "cca-a", "c", deadline, time.Minute) },
		func() (bool, int64, error) { return s.ApplyCloseAt(ctx, "cca-a", "c", time.Minute) },
	} {
		if applied, again, err := commit(); err != nil || !applied || again != at {
			t.Errorf("later commit: applied %v at %d, %v; want applied at %d, the first decision's", applied, again, err, at)
		}
	}

	before := redisNow(t, s.rdb).UnixMilli()
	if applied, at, err := s.ApplyCloseAt(ctx, "cca-b", "c", time.Minute); err != nil || !applied || at < before || at > redisNow(t, s.rdb).UnixMilli() {
		t.Errorf("apply: applied %v at %d, %v; want applied from %d to now", applied, at, err, before)
	}

	if _, err := s.Renew(ctx, "cca-c", "default", time.Minute, ClockPresence); err != nil {
		t.Fatal(err)
	}
	if applied, at, err := s.CommitCloseAt(ctx, "cca-c", "c", deadline, time.Minute); err != nil || applied || at != 0 {
		t.Errorf("commit after a renewal: applied %v at %d, %v; want cancelled at 0", applied, at, err)
	}

	// Decided applied by a release that kept no time.
	if err := s.rdb.Set(ctx, s.ks.CloseKey("cca-d", "c"), closeApplied, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if applied, at, err := s.CommitCloseAt(ctx, "cca-d", "c", deadline, time.Minute); err != nil || !applied || at != 0 {
		t.Errorf("commit of a close decided without a time: applied %v at %d, %v; want applied at 0", applied, at, err)
	}
}
