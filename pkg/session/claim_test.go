package session

import (
	"fmt"
	"testing"
	"time"
)

// TestClaimTimeoutsOfOneBucket: timeouts of one bucket are claimed in one
// script call, and each gets the outcome it gets alone, whatever the
// outcomes of the others before it in the call: no claim yet, this
// listener's own, another's, produced, spooled, retried twice, and
// another silence of the window produced (deferred to the window's end).
// Then releasing them frees only this listener's claims.
func TestClaimTimeoutsOfOneBucket(t *testing.T) {
	s, ctx := newStore(t)
	deadline := time.Now().Truncate(time.Minute).Add(time.Minute + 10*time.Second)
	var uids []string
	for i := 0; len(uids) < 7; i++ {
		if uid := fmt.Sprintf("u%d", i); Bucket(uid) == Bucket("u0") {
			uids = append(uids, uid)
		}
	}
	const me = "claimed:me"
	states := []struct {
		value   string // the dedup key's before, "" for none
		outcome string
		failed  int
	}{
		{"", ClaimFresh, 0},
		{me, ClaimFresh, 0},
		{DedupClaim("other"), ClaimBusy, 0},
		{DedupProduced(deadline), ClaimDone, 0},
		{DedupSpooled(deadline), ClaimSpooled, 0},
		{dedupFormat.encode(dedupRetry, "2"), ClaimFresh, 2},
		{DedupProduced(deadline.Add(-5 * time.Second)), ClaimDefer, 0},
	}
	es := make([]Expired, len(uids))
	for i, uid := range uids {
		es[i] = Expired{UID: uid, Stage: 1, Deadline: deadline, Due: deadline}
		if v := states[i].value; v != "" {
			if err := s.rdb.Set(ctx, s.ks.StageDedupKey(uid, 1, deadline), v, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	replies, errs := s.ClaimTimeouts(ctx, es, me, time.Minute)
	for i, st := range states {
		if errs[i] != nil {
			t.Fatalf("claim %s: %v", uids[i], errs[i])
		}
		if out, failed := ParseClaim(replies[i]); out != st.outcome || failed != st.failed {
			t.Errorf("claim of a key %q: %s, %d failed before; want %s, %d", st.value, out, failed, st.outcome, st.failed)
		}
	}
	if err := s.ReleaseClaims(ctx, es, me); err != nil {
		t.Fatal(err)
	}
	for i, st := range states {
		v, _ := s.rdb.Get(ctx, s.ks.StageDedupKey(uids[i], 1, deadline)).Result()
		switch {
		case st.outcome == ClaimFresh && v != "":
			t.Errorf("claim of a key %q: %q after its release, want none", st.value, v)
		case st.outcome != ClaimFresh && v != st.value:
			t.Errorf("key %q: %q after the releases, want it untouched", st.value, v)
		}
	}
}
