package session

import (
	"testing"
	"time"
)

// Attacks on the activity script's staleness rule, for events applied
// again (a batch resent after a 503, a topic record applied again by the
// next owner of its partition) or reaching us late.

// TestAttackAFReappliedActiveRestartsGuidedSilence: an active event with
// at_ms is applied, its user goes silent, and stage 1 of that silence is
// guided; a later stage is pending. The same event is applied again a
// moment later (the platform resends the batch, or the feed's next owner
// applies the record again). The gateway draws a fresh jitter for every
// application (grantTTL, grantJitter), so the second application's TTL
// may be longer than the first's: its time plus that TTL is not past,
// the event is not older than the renewal it made (at == renewed, not
// older), and it applies again. The grant finds the user between stages
// and cancels them as if the user had come back, and starts a new
// silence from the same at_ms with a later deadline: stage 1 is guided a
// second time (a new deadline, a new id), and the pending stage of the
// first silence is lost. The promise broken: one guide per silence;
// the contract says the events of a batch sent again are stale.
func TestAttackAFReappliedActiveRestartsGuidedSilence(t *testing.T) {
	s, ctx := newStore(t)
	rules := SegmentRules{Unlisted: SegmentRule{TTL: time.Second, Clock: ClockPresence}}
	uid := "attackaf-reapplied"
	at := redisNow(t, s.rdb)
	event := Activity{UID: uid, Kind: ActivityActive, At: at}
	// First application: the jitter drawn is 0.
	if res, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{event.jitterOf(0)}); err != nil || res.Applied != 1 {
		t.Fatalf("first application: %+v, %v", res, err)
	}
	// The user is silent: stage 1 is guided, stage 2 due an hour later.
	first := dueOne(t, s, uid, 10*time.Second, sweepAll(s))
	first.NextDue = first.Due.Add(time.Hour)
	if err := s.Settle(ctx, []Expired{first}); err != nil {
		t.Fatal(err)
	}
	// The same event again, with the jitter this application drew (the
	// default policy's jitter is 5s): applied within it.
	again := event.jitterOf(4 * time.Second)
	if now := redisNow(t, s.rdb); !now.Before(at.Add(time.Second + 4*time.Second)) {
		t.Skipf("the machine took %v to guide a 1s silence: the second application comes too late to show the case", now.Sub(at))
	}
	res, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{again})
	if err != nil {
		t.Fatal(err)
	}
	staged, err := s.rdb.HExists(ctx, s.ks.StageKey(Bucket(uid)), uid).Result()
	if err != nil {
		t.Fatal(err)
	}
	got := score(t, s, uid)
	if res.Stale != 1 || !staged || !got.Equal(first.NextDue) {
		t.Fatalf("the same active (at_ms %d) applied again after its silence's stage 1 was guided: %+v (want stale 1); "+
			"stages of the silence still pending %v (want true); index entry %v after the deadline %v, want stage 2's %v: "+
			"the guided silence was restarted from the same at_ms, its stage 1 is guided again and its stage 2 lost",
			at.UnixMilli(), res, staged, got.Sub(first.Deadline), first.Deadline.Format("15:04:05.000"), first.NextDue.Sub(first.Deadline))
	}
}

// TestAttackAFEndForgottenBeforeStaleActiveOver: a segment with a long
// TTL (the policy allows up to 24h; 4h here). The platform reports the
// user's last message (active, at_ms t) and then ends the conversation
// (end, at_ms t+1min). The active reaches us again later (a resend, a
// delayed sender of the platform): older than the end, it must be stale.
// But the end is remembered only RenewedKeep (2h) from when it was
// applied (endSession sets the renewed and turn keys to expire after
// keep), while the active is not over (at_ms plus the segment's TTL past
// now) until 4h after t. Between the two, the end is gone and the active
// applies: the session the platform ended comes back, and the user is
// guided (and closed, on a close policy) 4h after a conversation that was
// over. The end's keys must live until an active older than it is over.
func TestAttackAFEndForgottenBeforeStaleActiveOver(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = 4 * time.Hour
	rules := SegmentRules{Segments: map[string]SegmentRule{"long": {TTL: ttl, Clock: ClockPresence}},
		Unlisted: SegmentRule{TTL: time.Minute, Clock: ClockPresence}}
	uid := "attackaf-end-forgotten"
	now := redisNow(t, s.rdb)
	last := Activity{UID: uid, Kind: ActivityActive, Segment: "long", At: now.Add(-time.Minute)}
	end := Activity{UID: uid, Kind: ActivityEnd, At: now}
	if res, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{last, end}); err != nil || res.Applied != 2 {
		t.Fatalf("%+v, %v", res, err)
	}
	if live, err := s.Live(ctx, uid); err != nil || live {
		t.Fatalf("after the end: live %v, %v", live, err)
	}
	// What remembers the end must outlive the active's TTL (and jitter)
	// from its time: once it is gone, the active must be over by its own
	// time. Real time cannot pass hours in a test: the keys' PTTL says.
	over := last.At.Add(ttl + ttl/2) // stale by its own time, whatever its jitter
	for _, key := range []string{s.ks.RenewedKey(uid), s.ks.TurnKey(uid)} {
		left, err := s.rdb.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if gone := redisNow(t, s.rdb).Add(left); left <= 0 || gone.Before(over) {
			t.Fatalf("%s lives %v: gone %v before an active older than the end is over: "+
				"applied then, the conversation the platform ended comes back, and its user is guided",
				key, left, over.Sub(gone).Round(time.Minute))
		}
	}
	// While they live, the active, older than the end, is stale.
	res, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{last})
	if err != nil {
		t.Fatal(err)
	}
	if live, err := s.Live(ctx, uid); err != nil || res.Stale != 1 || live {
		t.Fatalf("an active of %v before the end, applied again: %+v, session live %v (%v)", time.Minute, res, live, err)
	}
}
