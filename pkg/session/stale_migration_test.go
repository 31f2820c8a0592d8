package session

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The dedup marks on a Redis Cluster whose slot migrates. A migrating
// slot serves a command of one key where the key is (ASK when it has
// moved), but answers TRYAGAIN, for as long as it migrates, to a command
// whose keys are not all in one place. So every dedup mark is of the
// dedup key alone.

// staleRigTimeout is the timeout of the first silence of a window, ahead
// of now so that its window has not ended when the test claims again.
func staleRigTimeout(uid string) Expired {
	deadline := time.Now().Truncate(time.Minute).Add(time.Minute + 10*time.Second)
	return Expired{UID: uid, Stage: 1, Deadline: deadline, Due: deadline}
}

func claimOn(t *testing.T, s *Store, listener string, e Expired, ttl time.Duration) string {
	t.Helper()
	replies, errs := s.ClaimTimeouts(context.Background(), []Expired{e}, DedupClaim(listener), ttl)
	if errs[0] != nil {
		t.Fatalf("claim of %q's timeout: %v", e.UID, errs[0])
	}
	out, _ := ParseClaim(replies[0])
	return out
}

// TestProducedMarkDuringSlotMigration: a listener replica claims a
// timeout and produces it (its guide goes out), and the bucket's slot
// starts to migrate before the replica marks it produced, as a reshard
// may at any moment. The mark (resolveClaims' pipeline) must land:
// otherwise the key keeps the claim until it lapses,
// and then a second silence of the user in the same minute finds no mark
// and is guided at once, before the window ends: two guides in one
// minute.
func TestProducedMarkDuringSlotMigration(t *testing.T) {
	const uid = "mig-produced"
	r := newMigrationRig(t, uid)
	s, ctx := r.s, context.Background()
	first := staleRigTimeout(uid)
	// A claim shorter than the listener's (30s at least), so that the
	// test need not wait for it; what follows its lapse is the same.
	const claimTTL = 2 * time.Second
	if got := claimOn(t, s, "listener-a", first, claimTTL); got != ClaimFresh {
		t.Fatalf("first claim: %q", got)
	}
	// Produced; now the slot migrates, no key moved yet.
	m := r.begin(t)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		s.MarkProduced(ctx, p, first, 2*time.Minute)
		return nil
	})
	if err != nil {
		t.Errorf("mark produced while the slot migrates: %v (the SET it replaced lands)", err)
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	dd := s.ks.StageDedupKey(uid, first.Stage, first.Due)
	v, _ := s.rdb.Get(ctx, dd).Result()
	t.Logf("dedup key after the mark: %q", v)
	// If the mark was lost the claim is all the key holds: wait for it to
	// lapse, as the listener's does.
	eventually(t, claimTTL+5*time.Second, "the dedup key to hold more than a lapsing claim", func() bool {
		v, err := s.rdb.Get(ctx, dd).Result()
		return err == redis.Nil || v != DedupClaim("listener-a")
	})
	second := first
	second.Deadline = first.Deadline.Add(20 * time.Second)
	second.Due = second.Deadline
	if got := claimOn(t, s, "listener-b", second, time.Minute); got != ClaimDefer {
		t.Fatalf("claim of a second silence in the window of a produced one: %q, want %q "+
			"(its guide would go out in the same minute as the first's)", got, ClaimDefer)
	}
}

// TestStaleMarkDuringSlotMigration: the consumer finds a produced
// timeout's silence over while the bucket's slot migrates. The mark must
// land: a second silence of
// the user in the window is guided at once, not at the window's end.
func TestStaleMarkDuringSlotMigration(t *testing.T) {
	const uid = "mig-stale"
	r := newMigrationRig(t, uid)
	s, ctx := r.s, context.Background()
	first := staleRigTimeout(uid)
	if got := claimOn(t, s, "listener-a", first, time.Minute); got != ClaimFresh {
		t.Fatalf("first claim: %q", got)
	}
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		s.MarkProduced(ctx, p, first, 2*time.Minute)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	m := r.begin(t)
	if err := s.MarkStale(ctx, uid, first.Stage, first.Due, first.Deadline); err != nil {
		t.Errorf("mark stale while the slot migrates: %v (the one-key script before the note ran)", err)
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	second := first
	second.Deadline = first.Deadline.Add(20 * time.Second)
	second.Due = second.Deadline
	if got := claimOn(t, s, "listener-b", second, time.Minute); got != ClaimFresh {
		t.Fatalf("claim of a second silence in the window of a stale one: %q, want %q "+
			"(its guide waits for the window's end)", got, ClaimFresh)
	}
}

// TestMarkPipelineOfMixedRefusals: the listener's resolveClaims marks,
// in one raw pipeline, a produced timeout and a spooled one.
// Mid-migration, on the source, the first's key is still there and the
// second's has moved (ASK). Were one of them refused TRYAGAIN (a script
// of two keys, one of them missing there), go-redis would resend the
// first's whole batch, the second with it, while it also follows the
// second's ASK: the second would run on two connections at once, racing
// on its reply (pipeline.go; the race detector fails this test then).
// One-key scripts are answered ASK, never TRYAGAIN.
func TestMarkPipelineOfMixedRefusals(t *testing.T) {
	const produced = "mig-mark-produced"
	r := newMigrationRig(t, produced)
	s, ctx := r.s, context.Background()
	var spooled string
	for i := 0; spooled == ""; i++ {
		if u := "mig-mark-spooled-" + itoa(i); Bucket(u) == r.bucket {
			spooled = u
		}
	}
	p1, p2 := staleRigTimeout(produced), staleRigTimeout(spooled)
	for _, e := range []Expired{p1, p2} {
		if got := claimOn(t, s, "listener-a", e, time.Minute); got != ClaimFresh {
			t.Fatalf("claim of %s: %q", e.UID, got)
		}
	}
	m := r.begin(t)
	defer func() {
		if err := m.Finish(ctx); err != nil {
			t.Fatal(err)
		}
	}()
	if err := m.Move(ctx, s.ks.StageDedupKey(spooled, 1, p2.Due)); err != nil {
		t.Fatal(err)
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		s.MarkProduced(ctx, p, p1, 2*time.Minute)
		s.MarkSpooled(ctx, p, p2, 2*time.Minute)
		return nil
	})
	if err != nil {
		t.Errorf("marks while the slot migrates: %v", err)
	}
}
