package session

import (
	"context"
	"testing"
	"time"
)

// TestCheckManyThroughSlotMigration: the consumer checks, in one
// pipeline, a user who ended their session (no session key; their end
// recorded as the last renewal) and one still live, while their bucket's
// slot migrates and the ended user's renewal key has already moved. Their
// check script then runs nowhere: the source answers ASK (neither key is
// there) and the target TRYAGAIN (one of its two keys is missing). The
// check must land once the slot has moved, as a single check did when
// go-redis resent it: a consumer that gets TRYAGAIN counts it against its
// Redis breaker, and a burst of them opens it, pausing every partition
// for a reshard of one slot.
func TestCheckManyThroughSlotMigration(t *testing.T) {
	const ended = "mig-check-ended"
	r := newMigrationRig(t, ended)
	var live string
	for i := 0; live == ""; i++ {
		if u := "mig-check-live-" + itoa(i); Bucket(u) == r.bucket {
			live = u
		}
	}
	s, ctx := r.s, context.Background()
	for _, uid := range []string{ended, live} {
		if _, err := s.Renew(ctx, uid, DefaultSegment, time.Minute, ClockPresence); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.End(ctx, ended); err != nil {
		t.Fatal(err)
	}
	m := r.begin(t)
	if err := m.Move(ctx, s.ks.RenewedKey(ended)); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		got  []Check
		errs []error
	}
	res := make(chan answer, 1)
	refused := r.refusals(t)
	go func() {
		got, errs := s.CheckMany(ctx, []string{ended, live})
		res <- answer{got, errs}
	}()
	eventually(t, 5*time.Second, "the check refused while the keys are split", func() bool { return r.refusals(t) > refused })
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-res
	for i, err := range a.errs {
		if err != nil {
			t.Errorf("check %d through the migration: %v", i, err)
		}
	}
	if a.errs[0] == nil && (a.got[0].Live || a.got[0].Renewed.IsZero()) {
		t.Errorf("check of the ended user = %+v, want not live, its end known", a.got[0])
	}
	if a.errs[1] == nil && !a.got[1].Live {
		t.Errorf("check of the live user = %+v, want live", a.got[1])
	}
}
