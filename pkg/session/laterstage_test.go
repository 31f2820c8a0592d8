package session

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestLaterStagePushed: a later stage of a silence counts while its push
// is under way, once settled with one of the outcomes asked for, and when
// a gateway from before uid scoping recorded it; not when it was settled
// otherwise (stale, too old), released, absent, or an earlier stage.
func TestLaterStagePushed(t *testing.T) {
	s, ctx := newStore(t)
	const deadline = int64(1_795_255_600_123)
	for _, tc := range []struct {
		name    string
		stage   int    // the later stage's
		outcome string // "": left claimed; "-": released
		legacy  bool
		want    bool
	}{
		{name: "none", want: false},
		{name: "claimed", stage: 2, want: true},
		{name: "delivered", stage: 2, outcome: "delivered", want: true},
		{name: "queued", stage: 3, outcome: "queued", want: true},
		{name: "stale", stage: 2, outcome: "stale", want: false},
		{name: "too old", stage: 2, outcome: "too_old", want: false},
		{name: "released", stage: 2, outcome: "-", want: false},
		{name: "an older gateway's", stage: 2, legacy: true, want: true},
		{name: "an earlier stage", stage: 1, outcome: "delivered", want: false},
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
			got, err := s.LaterStagePushed(ctx, uid, deadline, 1, "delivered", "queued")
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("LaterStagePushed after stage 1 = %v, want %v", got, tc.want)
			}
		})
	}
}
