package session

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestLaterStageGoes: a later stage of a silence goes to the devices
// while its push is under way, once settled with one of the outcomes
// asked for, and when a gateway from before uid scoping recorded it,
// unless its close was cancelled; and its close, undecided, is decided
// applied then, so that a connection's commit after the user came back
// still finds it applied. Not one settled otherwise (stale, too old),
// released, absent, or an earlier stage: their closes stay undecided.
func TestLaterStageGoes(t *testing.T) {
	s, ctx := newStore(t)
	const deadline = int64(1_795_255_600_123)
	for _, tc := range []struct {
		name    string
		stage   int    // the later stage's
		outcome string // "": left claimed; "-": released
		legacy  bool
		close   string // the later stage's close decided before: "applied", "cancelled"
		want    bool
		decided bool // the call decided the later stage's close (applied)
	}{
		{name: "none"},
		{name: "claimed", stage: 2, want: true, decided: true},
		{name: "delivered", stage: 2, outcome: "delivered", want: true, decided: true},
		{name: "queued", stage: 3, outcome: "queued", want: true, decided: true},
		{name: "an older gateway's", stage: 2, legacy: true, want: true, decided: true},
		{name: "delivered, applied", stage: 2, outcome: "delivered", close: "applied", want: true},
		{name: "claimed, applied", stage: 3, close: "applied", want: true},
		{name: "delivered, cancelled", stage: 2, outcome: "delivered", close: "cancelled"},
		{name: "stale", stage: 2, outcome: "stale"},
		{name: "too old", stage: 2, outcome: "too_old"},
		{name: "released", stage: 2, outcome: "-"},
		{name: "an earlier stage", stage: 1, outcome: "delivered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := "later-" + tc.name[:3] + "-" + time.Now().Format("150405.000000")
			if tc.stage > 0 {
				id := timeoutevent.StageID(uid, deadline, tc.stage)
				if tc.legacy {
					if err := s.rdb.Set(ctx, s.ks.PushedKey(uid, id), "1", time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
				} else {
					if st, err := s.ClaimPush(ctx, uid, id, "tok", time.Minute, deadline); err != nil || st != PushFresh {
						t.Fatalf("claim: %q, %v", st, err)
					}
					if tc.outcome != "" {
						out := tc.outcome
						if out == "-" {
							out = ""
						}
						if err := s.SettlePush(ctx, uid, id, "tok", out, time.Minute); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			if tc.close != "" {
				// A connection decided it, the user away then or back.
				id := timeoutevent.StageID(uid, deadline, tc.stage)
				if tc.close == closeCancelled {
					if _, err := s.Renew(ctx, uid, "default", time.Minute, ClockPresence); err != nil {
						t.Fatal(err)
					}
				}
				if applied, err := s.CommitClose(ctx, uid, id, deadline, time.Minute); err != nil || applied != (tc.close == closeApplied) {
					t.Fatalf("commit close: applied %v, %v", applied, err)
				}
			}
			got, err := s.LaterStageGoes(ctx, uid, deadline, 1, time.Minute, "delivered", "queued")
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("LaterStageGoes after stage 1 = %v, want %v", got, tc.want)
			}
			if tc.stage < 2 || tc.close != "" {
				return
			}
			// The user comes back; a connection about to write that
			// stage's close finds it as this call left it: applied, or
			// undecided and so cancelled now.
			if _, err := s.Renew(ctx, uid, "default", time.Minute, ClockPresence); err != nil {
				t.Fatal(err)
			}
			applied, err := s.CommitClose(ctx, uid, timeoutevent.StageID(uid, deadline, tc.stage), deadline, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if applied != tc.decided {
				t.Errorf("a connection's commit of the later stage's close after the user came back: applied %v, want %v", applied, tc.decided)
			}
		})
	}
}
