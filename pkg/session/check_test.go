package session

import (
	"context"
	"testing"
	"time"
)

// TestCheckMany: each uid gets its own answer, in the order given, from
// one pipeline: live, ended (its end recorded as its last renewal), and
// never seen; on a single Redis and on a cluster, where the uids' keys
// live in different slots.
func TestCheckMany(t *testing.T) {
	for name, open := range map[string]func(*testing.T) (*Store, context.Context){"single": newStore, "cluster": newClusterStore} {
		t.Run(name, func(t *testing.T) {
			s, ctx := open(t)
			if _, err := s.Renew(ctx, "live", DefaultSegment, time.Minute, ClockPresence); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Renew(ctx, "ended", DefaultSegment, time.Minute, ClockPresence); err != nil {
				t.Fatal(err)
			}
			if err := s.End(ctx, "ended"); err != nil {
				t.Fatal(err)
			}
			uids := []string{"never", "live", "ended", "live"}
			got, errs := s.CheckMany(ctx, uids)
			if len(got) != len(uids) || len(errs) != len(uids) {
				t.Fatalf("CheckMany of %d uids: %d answers, %d errors", len(uids), len(got), len(errs))
			}
			for i, err := range errs {
				if err != nil {
					t.Fatalf("check %s: %v", uids[i], err)
				}
			}
			want := []struct{ live, renewed bool }{{false, false}, {true, true}, {false, true}, {true, true}}
			for i, w := range want {
				if got[i].Live != w.live || got[i].Renewed.IsZero() == w.renewed {
					t.Errorf("check %s: live %v, renewed %v; want live %v, renewed known %v", uids[i], got[i].Live, got[i].Renewed, w.live, w.renewed)
				}
				if got[i].Now.IsZero() {
					t.Errorf("check %s: no Redis clock", uids[i])
				}
			}
			if one, err := s.Check(ctx, "live"); err != nil || !one.Live {
				t.Errorf("Check(live) = %+v, %v; want live", one, err)
			}
		})
	}
}
