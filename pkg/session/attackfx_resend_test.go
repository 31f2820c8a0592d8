package session

import (
	"testing"
	"time"
)

// TestAttackFXReappliedTurnUsRestartsGuidedSilence: the fix that made an
// event of its own time no newer than the state it would change stale
// covers an active (at_ms <= the last renewal) and a turn to the user
// (at_ms == the turn in force), but not a turn to us. A turn to us with
// at_ms t and a max hold is applied; the hold ends, the user's clock runs,
// the user stays silent and stage 1 of that silence is guided; a later
// stage is pending. The same event is applied again (the platform resends
// the batch after a 503, or the feed's next owner applies the record
// again), with the fresh jitter that application draws: its hold's end
// plus that TTL is not past, and at_ms == the turn state's since is not
// older, so it applies. The grant, unparking a turn to us, cancels the
// pending stages as if the user had come back, and writes a new deadline
// past the one guided: stage 1 is guided a second time and the pending
// stage is lost. The contract (docs/protocol.md, the activity API):
// "Sending a batch again is harmless ... the events applied the first
// time are stale the second".
func TestAttackFXReappliedTurnUsRestartsGuidedSilence(t *testing.T) {
	s, ctx := newStore(t)
	rules := SegmentRules{Unlisted: SegmentRule{TTL: time.Second, Clock: ClockPresence}}
	uid := "attackfx-turnus-again"
	at := redisNow(t, s.rdb)
	event := Activity{UID: uid, Kind: ActivityTurnUs, At: at, MaxHold: 500 * time.Millisecond}
	// First application: the jitter drawn is 0.
	if res, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{event.jitterOf(0)}); err != nil || res.Applied != 1 {
		t.Fatalf("first application: %+v, %v", res, err)
	}
	// The hold ends at t+500ms, the user is silent 1s more: stage 1 is
	// guided, stage 2 due an hour later.
	first := dueOne(t, s, uid, 10*time.Second, sweepAll(s))
	first.NextDue = first.Due.Add(time.Hour)
	if err := s.Settle(ctx, []Expired{first}); err != nil {
		t.Fatal(err)
	}
	// The same event again, with the jitter this application drew (the
	// default policy's jitter is 5s): applied within it.
	again := event.jitterOf(4 * time.Second)
	if now := redisNow(t, s.rdb); !now.Before(at.Add(500*time.Millisecond + time.Second + 4*time.Second)) {
		t.Skipf("the machine took %v to guide a 1.5s silence: the second application comes too late to show the case", now.Sub(at))
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
		t.Fatalf("the same turn to us (at_ms %d) applied again after its silence's stage 1 was guided: %+v (want stale 1); "+
			"stages of the silence still pending %v (want true); index entry %v after the deadline %v, want stage 2's %v: "+
			"the guided silence was restarted from the same at_ms, its stage 1 is guided again and its stage 2 lost",
			at.UnixMilli(), res, staged, got.Sub(first.Deadline), first.Deadline.Format("15:04:05.000"), first.NextDue.Sub(first.Deadline))
	}
}

// TestAttackFXPingShortensRememberedEnd: the fix keeps an end (the
// renewal and turn keys) at least 1.5x the policy's longest TTL, so that
// an active older than the end is over before the end is forgotten
// (docs/protocol.md: "The end is remembered for at least 2 h, and 1.5
// times the policy's longest session TTL"). But only the activity script
// keeps them so long: a WebSocket ping after the end (the user opens the
// app again, on a device of the default segment; a user's devices may be
// of different segments) grants through the renewal script, which sets
// the renewal, and re-expires the "ended" turn state, to its own deadline
// plus RenewedKeep (2h). The platform's last active of the conversation,
// of a 4h segment and a minute older than the end, reaches us again once
// those keys are gone (a resend, a delayed sender): it is not over until
// 4h after its time, so it applies, the conversation the platform ended
// comes back, and its user is guided 4h after it (and closed, on a close
// policy). Real time cannot pass hours in a test: the keys' PTTL says.
func TestAttackFXPingShortensRememberedEnd(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = 4 * time.Hour
	rules := SegmentRules{Segments: map[string]SegmentRule{"long": {TTL: ttl, Clock: ClockPresence}},
		Unlisted: SegmentRule{TTL: time.Minute, Clock: ClockPresence}}
	uid := "attackfx-ping-after-end"
	now := redisNow(t, s.rdb)
	last := Activity{UID: uid, Kind: ActivityActive, Segment: "long", At: now.Add(-time.Minute)}
	end := Activity{UID: uid, Kind: ActivityEnd, At: now}
	if res, err := s.ApplyActivity(ctx, "gw-a", rules, []Activity{last, end}); err != nil || res.Applied != 2 {
		t.Fatalf("%+v, %v", res, err)
	}
	// The user's phone, of the default segment, pings after the end.
	if _, err := s.Renew(ctx, uid, DefaultSegment, time.Minute, ClockPresence); err != nil {
		t.Fatal(err)
	}
	over := last.At.Add(ttl) // the active is over no sooner, whatever its jitter
	for _, key := range []string{s.ks.RenewedKey(uid), s.ks.TurnKey(uid)} {
		left, err := s.rdb.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if gone := redisNow(t, s.rdb).Add(left); left <= 0 || gone.Before(over) {
			t.Errorf("after a ping that followed the end, %s lives %v: gone %v before an active of a 4h segment, a minute older than the end, is over: "+
				"applied then, the conversation the platform ended comes back, and its user is guided",
				key, left.Round(time.Minute), over.Sub(gone).Round(time.Minute))
		}
	}
}
