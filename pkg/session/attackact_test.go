package session

import (
	"fmt"
	"testing"
	"time"
)

// Attacks on the activity script's reads: the segment it resolves per
// event from the rules, and the bucket's hold, held and stage keys it
// skips when it finds them empty as it starts.

// actRules: three listed segments (one of the turn clock) and the rule
// of every other.
var actRules = SegmentRules{
	Segments: map[string]SegmentRule{
		"vip":          {TTL: 3 * time.Hour, Clock: ClockPresence},
		DefaultSegment: {TTL: 2 * time.Hour, Clock: ClockPresence},
		"slow":         {TTL: 4 * time.Hour, Clock: ClockTurn},
	},
	Unlisted: SegmentRule{TTL: time.Hour, Clock: ClockPresence},
}

// bucketMates is n uids of one bucket, named after prefix.
func bucketMates(prefix string, n int) []string {
	out := []string{prefix + "-0"}
	for i := 1; len(out) < n; i++ {
		if uid := fmt.Sprintf("%s-%d", prefix, i); Bucket(uid) == Bucket(out[0]) {
			out = append(out, uid)
		}
	}
	return out
}

// TestAttackActMatesHeldStagedEnded: one call over a bucket where one
// user is held, one is between stages and one, held too, ends; a mate's
// event comes first. Were the empty-key skip wrong about any of them
// (a key read as empty, or one flag standing for another), the user who
// came back would keep a hold or a stage, and be guided while present.
func TestAttackActMatesHeldStagedEnded(t *testing.T) {
	t.Parallel()
	base, ctx := newStore(t)
	s := base.WithHoldNotes(testNotes)
	u := bucketMates("act", 4)
	mate, staged, held, ender := u[0], u[1], u[2], u[3]

	// staged: guided once, the next stage an hour away.
	apply(t, s, ev(staged, ActivityTurnUser, 50*time.Millisecond))
	first := dueOne(t, s, staged, 5*time.Second, sweepAll(s))
	first.NextDue = first.Due.Add(time.Hour)
	if err := s.Settle(ctx, []Expired{first}); err != nil {
		t.Fatal(err)
	}
	holdOne(t, s, held)
	holdOne(t, s, ender)

	now := redisNow(t, s.rdb)
	res, err := s.ApplyActivity(ctx, "gw-a", actRules, []Activity{
		ev(mate, ActivityActive, 0),
		ev(staged, ActivityActive, 0),
		{UID: ender, Kind: ActivityEnd},
		ev(held, ActivityTurnUser, 0),
	})
	if err != nil || res.Applied != 4 {
		t.Fatalf("%+v, %v", res, err)
	}
	b := Bucket(mate)
	if n := s.rdb.ZCard(ctx, s.ks.HoldKey(b)).Val(); n != 0 {
		t.Errorf("hold set holds %d after the held users renewed and ended", n)
	}
	if n := s.rdb.HLen(ctx, s.ks.HeldKey(b)).Val(); n != 0 {
		t.Errorf("held hash holds %d after the held users renewed and ended", n)
	}
	if n := s.rdb.HLen(ctx, s.ks.StageKey(b)).Val(); n != 0 {
		t.Errorf("stage hash holds %d after the staged user came back", n)
	}
	// The staged user's index entry is their new deadline, by the rules
	// of the default segment, not the next stage's hour.
	if got := score(t, s, staged); !near(got, now.Add(2*time.Hour), 2*time.Second) {
		t.Errorf("staged user's deadline %v from now, want the default rule's 2h", got.Sub(now))
	}
	if live, err := s.Live(ctx, ender); err != nil || live {
		t.Errorf("ended user live %v, %v", live, err)
	}
}

// TestAttackActSegmentWithinBatch: the segment of an event of none is
// the one the events before it in the same call left. A script that
// resolved it once per call, or from the session before the call (as a
// look-up before the batch did), would grant the wrong TTL or clock: a
// guide early, or hours late.
func TestAttackActSegmentWithinBatch(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	for uid, seg := range map[string]string{"was-vip": "vip", "was-slow": "slow"} {
		if _, err := s.Renew(ctx, uid, seg, time.Minute, ClockPresence); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		events []Activity
		uid    string
		seg    string
		offset time.Duration
	}{
		{"an end first: the default segment's rule, not vip's", []Activity{
			{UID: "was-vip", Kind: ActivityEnd}, ev("was-vip", ActivityActive, 0)}, "was-vip", DefaultSegment, 2 * time.Hour},
		{"a segment named first: its rule", []Activity{
			ev("new", ActivityActive, 3*time.Hour).segment("vip"), ev("new", ActivityTurnUser, 0)}, "new", "vip", 3 * time.Hour},
		{"out of a turn-clock segment: no park", []Activity{
			ev("was-slow", ActivityActive, time.Hour).segment("other"), ev("was-slow", ActivityActive, 0)}, "was-slow", "other", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := redisNow(t, s.rdb)
			if res, err := s.ApplyActivity(ctx, "gw", actRules, tc.events); err != nil || res.Applied != len(tc.events) {
				t.Fatalf("%+v, %v", res, err)
			}
			seg, err := s.rdb.HGet(ctx, s.ks.SegmentsKey(Bucket(tc.uid)), tc.uid).Result()
			if err != nil || seg != tc.seg {
				t.Fatalf("segment %q, %v; want %q", seg, err, tc.seg)
			}
			if got := score(t, s, tc.uid); !near(got, now.Add(tc.offset), 2*time.Second) {
				t.Fatalf("deadline %v from now, want %v", got.Sub(now), tc.offset)
			}
			v, err := s.rdb.Get(ctx, s.ks.SessionKey(tc.uid)).Result()
			if f, ok := sessionFormat.decode(v); err != nil || !ok || f[0] != tc.seg {
				t.Fatalf("session %q, %v; want of segment %q", v, err, tc.seg)
			}
		})
	}
}
