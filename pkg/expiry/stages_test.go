package expiry

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// stagePolicy stores a policy whose default segment reminds at the
// deadline, again after 1s, and closes 1s after that; segment vip
// reminds twice and never closes.
func (h *harness) stagePolicy() {
	h.t.Helper()
	p := policy.Policy{
		DefaultTTL: 10 * time.Second,
		SegmentStages: map[string][]policy.Stage{
			"default": {
				{Action: timeoutevent.ActionRemind},
				{After: time.Second, Action: timeoutevent.ActionRemind, Text: "Still with us?"},
				{After: time.Second, Action: timeoutevent.ActionClose, Text: "We closed this chat."},
			},
			"vip": {
				{Action: timeoutevent.ActionRemind, Text: "Anything else?"},
				{After: time.Second, Action: timeoutevent.ActionRemind, Text: "We are here when you need us."},
			},
			// Room to come back between the stages, however slow the
			// machine: its close would come 3s after the reminder.
			"slow": {
				{Action: timeoutevent.ActionRemind},
				{After: 3 * time.Second, Action: timeoutevent.ActionClose, Text: "We closed this chat."},
			},
		},
	}
	h.savePolicy(p)
}

// savePolicy stores p, as `gateway policy set` does.
func (h *harness) savePolicy(p policy.Policy) {
	h.t.Helper()
	if err := policy.NewStore(h.rdb, h.store.Keyspace()).Save(context.Background(), p); err != nil {
		h.t.Fatal(err)
	}
}

// nextStage reads, in Redis, the stage uid's silence is due for next,
// past the first, and when: ok once a stage of it was settled, and not
// while the next one waits for a spool's replay (due for no replica). A
// test that must act between two stages acts on this, at once: reading
// the topic back, a consumer built for each look, can take seconds on a
// busy machine, longer than the delay between two stages.
func (h *harness) nextStage(uid string) (stage int, due time.Time, ok bool) {
	h.t.Helper()
	ctx := context.Background()
	ks := h.store.Keyspace()
	b := session.Bucket(uid)
	var staged *redis.StringCmd
	var score *redis.FloatCmd
	if _, err := h.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		staged = p.HGet(ctx, ks.StageKey(b), uid)
		score = p.ZScore(ctx, ks.IndexKey(b), uid)
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		h.t.Fatal(err)
	}
	v, err := staged.Result()
	if errors.Is(err, redis.Nil) {
		return 0, time.Time{}, false
	}
	at, err2 := score.Result()
	if errors.Is(err2, redis.Nil) || at >= float64(session.AfterReplay.UnixMilli()) {
		return 0, time.Time{}, false
	}
	if err = errors.Join(err, err2); err != nil {
		h.t.Fatal(err)
	}
	n, _, _ := strings.Cut(v, ":") // "<stage>:<deadline ms>"
	if stage, err = strconv.Atoi(n); err != nil {
		h.t.Fatalf("%s's stage hash value %q: %v", uid, v, err)
	}
	return stage, time.UnixMilli(int64(at)), true
}

// blindRelease is when a stage due at due may go out at the earliest by
// the blind intervals of everyone in blind: the grace after the latest
// that holds it (due falls in it, or in the grace after it), else due. A
// listener starved on a busy machine records such intervals itself (a
// sweep gap, a clock step), and rightly holds what falls due in them.
func blindRelease(due time.Time, blind []session.BlindInterval) time.Time {
	release := due
	for _, b := range blind {
		end := b.End.Add(testGrace)
		if b.Scope == "" && !due.Before(b.Start) && !due.After(end) && end.After(release) {
			release = end
		}
	}
	return release
}

// wantStages checks uid's events: one per stage, in order, each due its
// delay after the one before, with its action, text and id, all of the
// silence that ran out at g.deadline, each on time but for the holds of
// the blind intervals recorded, blind.
func wantStages(t *testing.T, evs []timeoutevent.Event, uid string, g grant, actions []string, afters []time.Duration, blind []session.BlindInterval) {
	t.Helper()
	if len(evs) != len(actions) {
		t.Fatalf("%s: %d events %+v, want %d stages", uid, len(evs), evs, len(actions))
	}
	due := g.deadline
	seen := map[string]bool{}
	for i, ev := range evs {
		if i > 0 {
			// Its delay after the stage before was found due.
			due = time.UnixMilli(max(evs[i-1].DueMS, evs[i-1].DetectedMS)).Add(afters[i])
		}
		switch {
		case ev.Stage != i+1, ev.DeadlineMS != g.deadline.UnixMilli(), ev.DueMS != due.UnixMilli(),
			ev.Action != actions[i], ev.Final != (actions[i] == timeoutevent.ActionClose),
			ev.ID != timeoutevent.StageID(uid, g.deadline.UnixMilli(), i+1), seen[ev.ID]:
			t.Fatalf("%s stage %d: %+v; want due %d, action %s", uid, i+1, ev, due.UnixMilli(), actions[i])
		}
		seen[ev.ID] = true
		// Produced on time: within a second of being due, or of its
		// release when a blind interval held it (detection is by Redis's
		// clock; the listener reads ahead every 100ms).
		detected, release := time.UnixMilli(ev.DetectedMS), blindRelease(due, blind)
		if late := detected.Sub(release); detected.Before(due) || late > time.Second {
			t.Fatalf("%s stage %d detected %v after due, %v after its release by blind intervals %+v",
				uid, i+1, detected.Sub(due), late, blind)
		}
	}
}

// TestStagesOfASilence: a silent user gets each stage of their segment's
// policy, once, on time; one who comes back between stages gets no more
// of them, and their next silence starts at stage 1.
func TestStagesOfASilence(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.stagePolicy()
	stop := h.start(h.config(ModeSweep))
	defer stop()

	// "back" comes back after stage 1, before stage 2: the stages left
	// of that silence are dropped. Their next silence, in the same
	// minute window as the first, waits for the window's end (the minute
	// rule): nothing more within this test. So the test starts early in
	// a minute: a window's end a few seconds on would rightly release it.
	h.waitSecondOfMinute(0, 40)
	silent := h.renew("silent", "default", 300*time.Millisecond)
	vip := h.renew("vip", "vip", 300*time.Millisecond)
	back := h.renew("back", "slow", 300*time.Millisecond)
	// back comes back as soon as its reminder went out (its silence is
	// then due for its close), as Redis says: waiting to read the
	// reminder back from the topic took seconds on a busy machine, and
	// once the close had gone out too, back never had one event alone.
	var closeDue time.Time
	waitFor(t, waitLong, "back's stage 1 to go out", func() bool {
		stage, due, ok := h.nextStage("back")
		closeDue = due
		return ok && stage == 2
	})
	h.renew("back", "slow", 1500*time.Millisecond)
	renewed, err := h.store.LastRenewed(context.Background(), "back")
	if err != nil {
		t.Fatal(err)
	}

	waitFor(t, waitLong, "every stage", func() bool {
		by := byUID(h.events())
		return len(by["silent"]) == 3 && len(by["vip"]) == 2 && len(by["back"]) >= 1
	})
	// Nothing more comes: not the silent users', nor back's close.
	h.sweptPast(closeDue)
	by, blind := byUID(h.events()), h.blindList(context.Background())
	if evs := by["back"]; len(evs) > 1 && evs[1].DetectedMS < renewed.UnixMilli() {
		t.Fatalf("back's close was found due at %d, before the test renewed at %d (%v after the close was due): "+
			"the test came back too late to test the case", evs[1].DetectedMS, renewed.UnixMilli(), renewed.Sub(closeDue))
	}
	wantStages(t, by["silent"], "silent", silent, []string{"remind", "remind", "close"}, []time.Duration{0, time.Second, time.Second}, blind)
	wantStages(t, by["vip"], "vip", vip, []string{"remind", "remind"}, []time.Duration{0, time.Second}, blind)
	if by["vip"][0].Text != "Anything else?" || by["silent"][0].Text != "" || by["silent"][2].Text != "We closed this chat." {
		t.Fatalf("texts: %q %q %q", by["vip"][0].Text, by["silent"][0].Text, by["silent"][2].Text)
	}
	wantStages(t, by["back"], "back", back, []string{"remind"}, []time.Duration{0}, blind)
	ks := h.store.Keyspace()
	if _, err := h.rdb.ZScore(context.Background(), ks.HoldKey(session.Bucket("back")), "back").Result(); err != nil && !h.inIndex("back") {
		t.Fatal("back's second silence is neither in the index nor held to its window's end")
	}
	h.waitSettled([]string{"silent", "vip"})
}

// TestStagesAcrossListenerRestart: a listener stopped between stages, and
// another started, lose and double nothing: the schedule is in Redis.
func TestStagesAcrossListenerRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.stagePolicy()
	stop := h.start(h.config(ModeSweep))
	h.renew("ruth", "default", 200*time.Millisecond)
	// The listener stops as soon as stage 1 went out, as Redis says, a
	// second before stage 2 is due: reading the topic back took seconds
	// on a busy machine, and once stage 2 had gone out too, ruth never
	// had one event alone.
	var due2 time.Time
	waitFor(t, waitLong, "stage 1 to go out", func() bool {
		stage, due, ok := h.nextStage("ruth")
		due2 = due
		return ok && stage == 2
	})
	stop()
	if evs := byUID(h.events())["ruth"]; len(evs) != 1 {
		t.Fatalf("events %+v once the listener stopped, want stage 1 alone: stage 2 was due at %d (a stop that "+
			"took longer than the second before it does not test the case)", evs, due2.UnixMilli())
	}
	// Stage 2 falls due while no listener runs.
	h.untilRedis(due2.Add(500 * time.Millisecond))
	stop = h.start(h.config(ModeSweep))
	defer stop()
	waitFor(t, waitLong, "stage 3", func() bool { return len(byUID(h.events())["ruth"]) >= 3 })
	h.sweptPast(h.redisNow()) // and nothing more
	evs := byUID(h.events())["ruth"]
	if len(evs) != 3 || evs[1].Stage != 2 || evs[2].Stage != 3 || !evs[2].Final {
		t.Fatalf("events %+v, want stages 1, 2 and 3 once each", evs)
	}
	h.waitSettled([]string{"ruth"})
}

// TestStagesInEventsMode: a listener of keyspace events alone, which gets
// no event for a later stage, finds later stages all the same.
func TestStagesInEventsMode(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.stagePolicy()
	stop := h.start(h.config(ModeEvents))
	defer stop()
	h.waitSubscribed(1)
	g := h.renew("eve", "vip", 200*time.Millisecond)
	waitFor(t, waitLong, "both stages", func() bool { return len(byUID(h.events())["eve"]) >= 2 })
	h.sweptPast(h.redisNow()) // and nothing more
	evs := byUID(h.events())["eve"]
	if len(evs) != 2 || evs[0].Stage != 1 || evs[1].Stage != 2 || evs[1].DeadlineMS != g.deadline.UnixMilli() {
		t.Fatalf("events %+v, want stages 1 and 2 once each", evs)
	}
}
