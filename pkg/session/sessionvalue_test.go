package session

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestGrantWritesHashesOnlyWhenChanged: the session key's value says the
// segment and the via that the bucket's hashes hold for the user, so a
// renewal or an active event that changes neither writes neither hash,
// and one that changes either writes it. After every step the hashes
// hold what a grant that always wrote them would have left.
func TestGrantWritesHashesOnlyWhenChanged(t *testing.T) {
	s, ctx := newStore(t)
	const uid = "hashes"
	b := Bucket(uid)
	renew := func(seg, inst string, ttl time.Duration) func() {
		return func() {
			t.Helper()
			if err := renewScript.Run(ctx, s.rdb, s.ks.grantKeys(uid), HoldNotes{}.args([]any{uid, ttl.Milliseconds(), seg,
				inst, modeRenew, RenewedKeep.Milliseconds(), 0, "", MaxTurnHold.Milliseconds()})...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	active := func() { apply(t, s, ev(uid, ActivityActive, time.Minute)) } // of instance gw-a, no segment
	// A grant shorter than the deadline it keeps reads the deadline's
	// granter from the session's value, and from the via hash only when
	// the value does not say it: 1 HGET (the renewal reads the user's
	// stage entry), 2 when not known. wantHGETs -1 is not counted.
	stepReads := func(name string, do func(), wantHSETs, wantHGETs int64, wantSeg, wantVia string) {
		t.Helper()
		before, beforeGets := calls(t, s, "hset"), calls(t, s, "hget")
		do()
		got, gets := calls(t, s, "hset")-before, calls(t, s, "hget")-beforeGets
		seg := s.rdb.HGet(ctx, s.ks.SegmentsKey(b), uid).Val()
		via := s.rdb.HGet(ctx, s.ks.ViaKey(b), uid).Val()
		if wantHGETs < 0 {
			gets = -1
		}
		if got != wantHSETs || gets != wantHGETs || seg != wantSeg || via != wantVia {
			t.Errorf("%s: %d HSET, %d HGET, segment %q, via %q; want %d, %d, %q, %q", name, got, gets, seg, via, wantHSETs, wantHGETs, wantSeg, wantVia)
		}
	}
	step := func(name string, do func(), wantHSETs int64, wantSeg, wantVia string) {
		t.Helper()
		stepReads(name, do, wantHSETs, -1, wantSeg, wantVia)
	}

	step("a first renewal", renew("default", "gw-a", time.Minute), 2, "default", "gw-a")
	step("the same again", renew("default", "gw-a", time.Minute), 0, "default", "gw-a")
	step("from another instance", renew("default", "gw-b", time.Minute), 1, "default", "gw-b")
	step("in another segment", renew("vip", "gw-b", time.Minute), 1, "vip", "gw-b")
	// Another device's shorter grant keeps the longer one's deadline,
	// segment and granter, and names its own instance as the last.
	stepReads("a shorter grant elsewhere", renew("default", "gw-c", 2*time.Second), 1, 1, "vip", "gw-b,gw-c")
	stepReads("the same again", renew("default", "gw-c", 2*time.Second), 0, 1, "vip", "gw-b,gw-c")
	// An active event of no segment is of the user's current one.
	step("an active event", active, 1, "vip", "gw-a")
	step("another", active, 0, "vip", "gw-a")
	// A grant of no instance writes no via, and keeps the one known.
	step("a renewal of no instance", renew("vip", "", time.Minute), 0, "vip", "gw-a")
	step("then one of gw-a", renew("vip", "gw-a", time.Minute), 0, "vip", "gw-a")

	// A session written before its value carried the via: not known, so
	// written once.
	if err := s.rdb.Do(ctx, "SET", s.ks.SessionKey(uid), "vip", "KEEPTTL").Err(); err != nil {
		t.Fatal(err)
	}
	step("a value without the via", renew("vip", "gw-a", time.Minute), 1, "vip", "gw-a")
	step("the same again", renew("vip", "gw-a", time.Minute), 0, "vip", "gw-a")
	// A shorter grant of a value without the via reads the granter from
	// the hash.
	if err := s.rdb.Do(ctx, "SET", s.ks.SessionKey(uid), "vip", "KEEPTTL").Err(); err != nil {
		t.Fatal(err)
	}
	stepReads("a shorter grant, the via not known", renew("vip", "gw-b", 2*time.Second), 1, 2, "vip", "gw-a,gw-b")
	step("a renewal of gw-a", renew("vip", "gw-a", time.Minute), 1, "vip", "gw-a")

	// After the end the hashes have no entry, nor the session key: both
	// written again.
	if err := s.End(ctx, uid); err != nil {
		t.Fatal(err)
	}
	step("after the end", renew("vip", "gw-a", time.Minute), 2, "vip", "gw-a")
	// The session key gone at its deadline while the hashes keep the
	// user (between stages, until the listener settles them): nothing
	// spared, nothing lost.
	if err := s.rdb.Del(ctx, s.ks.SessionKey(uid)).Err(); err != nil {
		t.Fatal(err)
	}
	step("the session key gone", renew("vip", "gw-a", time.Minute), 2, "vip", "gw-a")
}

// calls is how many of command (lower case) s's Redis has run, scripts'
// too.
func calls(t *testing.T, s *Store, command string) int64 {
	t.Helper()
	info, err := s.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`cmdstat_` + command + `:calls=(\d+),`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}
