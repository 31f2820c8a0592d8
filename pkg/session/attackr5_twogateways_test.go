package session

import (
	"context"
	"testing"
	"time"
)

// TestAttackR5TwoGatewaysRestoreNeverShortens: a user's session runs as
// long as the longest grant of any of their devices (Renew: "later while
// another device's grant runs longer"; Grant: a resync "never shortens a
// deadline already written"). After Redis lost its data, each gateway of
// the user restores its own connection's grant, in whatever order their
// resyncs land. Two devices, two TTLs (two segments, or one TTL jittered
// per ping): device 1, on gateway A, pinged last, with the shorter grant;
// device 2, on gateway B, a moment before, with the longer one.
//
//   - A's grant, restored first (lapsed at its own deadline or live),
//     records device 1's ping as the user's last renewal;
//   - B's grant, the longer, then finds a renewal newer than its ping
//     ("was > at") and restores nothing.
//
// The session is left at device 1's deadline, short of device 2's grant
// by the TTLs' difference: the user is guided while device 2's grant, the
// deadline its pong named, still runs. Landed the other way round (B,
// then A), the session keeps B's deadline: the outcome rests on which
// gateway's resync lands first.
func TestAttackR5TwoGatewaysRestoreNeverShortens(t *testing.T) {
	s, ctx := newStore(t)
	ra := NewRenewer(s, RenewerConfig{Instance: "gw-a"})
	rb := NewRenewer(s, RenewerConfig{Instance: "gw-b"})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	for _, r := range []*Renewer{ra, rb} {
		go func() { r.Run(rctx); done <- struct{}{} }()
	}
	defer func() { cancel(); <-done; <-done }()

	const (
		shortTTL = 20 * time.Second // device 1's grant
		longTTL  = 60 * time.Second // device 2's grant
	)
	t.Run("control: B's resync first", func(t *testing.T) {
		const uid = "two-ttls-b-first"
		now := time.Now()
		ago1 := 5 * time.Second
		ago2 := ago1 + 100*time.Millisecond
		g1 := Grant{UID: uid, Segment: DefaultSegment, Left: shortTTL - ago1, Ago: ago1, Taken: now}
		g2 := Grant{UID: uid, Segment: DefaultSegment, Left: longTTL - ago2, Ago: ago2, Taken: now}
		if _, err := rb.Resync(ctx, []Grant{g2}); err != nil {
			t.Fatal(err)
		}
		if _, err := ra.Resync(ctx, []Grant{g1}); err != nil {
			t.Fatal(err)
		}
		want := redisNow(t, s.rdb).Add(longTTL - ago2)
		if got := score(t, s, uid); got.Before(want.Add(-time.Second)) {
			t.Fatalf("session due at %v, want device 2's deadline %v: the control fails, the case below tells nothing", got, want)
		}
	})
	for _, tc := range []struct {
		name string
		// device 1's ping, how long before the resync: its grant has
		// shortTTL-ago1 left (lapsed when negative).
		ago1 time.Duration
	}{
		{"device 1's grant lapsed", shortTTL + 2*time.Second},
		{"device 1's grant live", 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := "two-ttls-" + map[bool]string{true: "lapsed", false: "live"}[tc.ago1 > shortTTL]
			ago2 := tc.ago1 + 100*time.Millisecond // device 2 pinged a moment before device 1
			now := time.Now()
			g1 := Grant{UID: uid, Segment: DefaultSegment, Left: shortTTL - tc.ago1, Ago: tc.ago1, Taken: now}
			g2 := Grant{UID: uid, Segment: DefaultSegment, Left: longTTL - ago2, Ago: ago2, Taken: now}
			// Redis lost the user's data (nothing of them is stored):
			// A's resync lands first, then B's.
			if _, err := ra.Resync(ctx, []Grant{g1}); err != nil {
				t.Fatal(err)
			}
			if _, err := rb.Resync(ctx, []Grant{g2}); err != nil {
				t.Fatal(err)
			}
			redisAt := redisNow(t, s.rdb)
			want := redisAt.Add(longTTL - ago2) // device 2's deadline
			got := score(t, s, uid)
			if got.Before(want.Add(-time.Second)) {
				t.Errorf("session due at %v, %v before device 2's deadline %v: restored at device 1's, shorter grant; device 2's grant was skipped as older than device 1's ping (want the longest grant of the user's devices)",
					got.Format(time.RFC3339Nano), want.Sub(got).Round(time.Millisecond), want.Format(time.RFC3339Nano))
			}
		})
	}
}
