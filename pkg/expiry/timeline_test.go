package expiry

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// The tests of the listener's entries in users' timelines: each reads
// the timeline back as the endpoint does, and compares its kinds and
// rules in order.

// timelineOf is uid's timeline.
func (h *harness) timelineOf(uid string) []timeline.Entry {
	h.t.Helper()
	es, err := timeline.Read(context.Background(), h.store, uid, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	return es
}

// steps are the entries' kinds, with their rules: "held:blind".
func steps(es []timeline.Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = string(e.Kind)
		if e.Rule != "" {
			out[i] += ":" + e.Rule
		}
	}
	return out
}

// waitTimeline waits until uid's timeline shows want, in order, and
// returns it.
func (h *harness) waitTimeline(uid string, want ...string) []timeline.Entry {
	h.t.Helper()
	var got []timeline.Entry
	if !eventually(waitLong, func() bool { got = h.timelineOf(uid); return slices.Equal(steps(got), want) }) {
		h.t.Fatalf("timeline of %s: %q, want %q", uid, steps(got), want)
	}
	return got
}

func logTimeline(t *testing.T, es []timeline.Entry) {
	t.Helper()
	var b strings.Builder
	timeline.Format(&b, es, time.UTC)
	t.Log("\n" + b.String())
}

// checkSilence checks that e is of g's silence, at stage 1, by a listener.
func checkSilence(t *testing.T, e timeline.Entry, g grant) {
	t.Helper()
	if e.Deadline != g.deadline.UnixMilli() || e.Stage != 1 || e.Segment != g.segment || e.Service != "listener" || e.Instance == "" {
		t.Errorf("%s entry %+v, want deadline %d, stage 1, segment %q, by a listener replica", e.Kind, e, g.deadline.UnixMilli(), g.segment)
	}
}

// TestTimelineGuided: a user guided normally: the lapse, then the event
// produced, with its id.
func TestTimelineGuided(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stop := h.start(h.config(ModeHybrid))
	defer stop()
	g := h.renew("user", "default", 300*time.Millisecond)
	h.waitProduced(1)
	es := h.waitTimeline("user", "lapse", "produced")
	logTimeline(t, es)
	for _, e := range es {
		checkSilence(t, e, g)
	}
	if id := timeoutevent.ID("user", g.deadline.UnixMilli()); es[1].Event != id {
		t.Errorf("produced event %q, want %q", es[1].Event, id)
	}
	// Found and produced in one emit: one write, the lapse folded in.
	if n := h.storedEntries("user"); n != 1 {
		t.Errorf("%d entries stored for a lapse and its event, want 1, the lapse folded into the produced", n)
	}
	if es[0].At.After(es[1].At) || es[0].Service != es[1].Service || es[0].Instance != es[1].Instance {
		t.Errorf("lapse %+v does not read as made by the same listener before its event %+v", es[0], es[1])
	}
}

// TestTimelineHeldThroughRedisRestart: a deadline that falls just after
// Redis restarted is held by the blind interval of the restart, with its
// reason, then rechecked at the grace after it and guided.
func TestTimelineHeldThroughRedisRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Its data kept, as a persistent Redis keeps it: the silence
	// outlives the restart.
	srv, err := redisserver.Start(ctx, redisserver.Options{Dir: t.TempDir(), AOF: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	h := newHarnessOn(t, redistest.Client(t, srv))
	h.srv = srv
	l, stop := h.startListener(h.config(ModeHybrid))
	defer stop()
	// A restart is known by the run id of the mark before it.
	waitFor(t, waitLong, "the listener's first mark", func() bool { return h.listenerMark(l.marker.id) != "" })
	before := len(h.blindList(ctx))
	g := h.renew("user", "default", time.Second)
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "the restart to be marked", func() bool { return len(h.blindList(ctx)) > before })
	h.waitProduced(1)
	es := h.waitTimeline("user", "lapse", "held:blind", "rechecked", "produced")
	logTimeline(t, es)
	held := es[1]
	checkSilence(t, held, g)
	d := g.deadline.UnixMilli()
	if held.Detail != "Redis restarted" || held.BlindMS[0] == 0 || held.BlindMS[0] > d || held.BlindMS[1]+testGrace.Milliseconds() < d {
		t.Errorf("held %+v: want the restart's blind interval around deadline %d, its reason said", held, d)
	}
	if held.Until != held.BlindMS[1]+testGrace.Milliseconds() {
		t.Errorf("held until %d, want the grace after the interval, %d", held.Until, held.BlindMS[1]+testGrace.Milliseconds())
	}
	checkSilence(t, es[2], g)
}

// TestTimelineHeldThenStale: a held lapse whose user came back during
// the hold is found stale when its hold's timer fires, not guided.
func TestTimelineHeldThenStale(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	start := h.redisNow()
	if err := h.store.RecordBlind(context.Background(), session.BlindInterval{
		Start: start, End: start.Add(time.Second), Reason: session.BlindFailover,
	}); err != nil {
		t.Fatal(err)
	}
	stop := h.start(h.config(ModeHybrid))
	defer stop()
	g := h.renew("user", "default", 500*time.Millisecond)
	es := h.waitTimeline("user", "lapse", "held:blind")
	if es[1].Detail != "Redis failed over" {
		t.Errorf("held: detail %q, want the blind interval's reason", es[1].Detail)
	}
	h.renew("user", "default", time.Minute) // came back while held
	es = h.waitTimeline("user", "lapse", "held:blind", "rechecked", "stale:renewed")
	logTimeline(t, es)
	checkSilence(t, es[0], g)
	if n := h.produced(); n != 0 {
		t.Fatalf("%d events for a user who came back", n)
	}
}

// TestTimelineDeferredByMinuteRule: a second silence in the minute window
// of a guided one is held to the window's end: held by the minute rule.
func TestTimelineDeferredByMinuteRule(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stop := h.start(h.config(ModeHybrid))
	defer stop()
	windowEnd := h.waitSecondOfMinute(0, 40)
	h.renew("user", "default", 300*time.Millisecond)
	h.waitProduced(1)
	h.waitTimeline("user", "lapse", "produced")
	second := h.renew("user", "default", 300*time.Millisecond)
	es := h.waitTimeline("user", "lapse", "produced", "lapse", "held:minute")
	logTimeline(t, es)
	held := es[3]
	checkSilence(t, held, second)
	if held.Until != windowEnd.UnixMilli() || held.Detail != "second silence in the minute window" {
		t.Errorf("held %+v, want until the window's end %d, and why", held, windowEnd.UnixMilli())
	}
}

// TestTimelineDeduped: a timeout whose dedup key says it was produced
// already is settled with nothing sent: deduped, by rule produced.
func TestTimelineDeduped(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.renew("user", "default", 300*time.Millisecond)
	key := h.store.Keyspace().StageDedupKey("user", 1, g.deadline)
	if err := h.rdb.Set(context.Background(), key, session.DedupProduced(g.deadline), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	stop := h.start(h.config(ModeHybrid))
	defer stop()
	es := h.waitTimeline("user", "lapse", "deduped:produced")
	logTimeline(t, es)
	checkSilence(t, es[1], g)
	if id := timeoutevent.ID("user", g.deadline.UnixMilli()); es[1].Event != id {
		t.Errorf("deduped event %q, want %q", es[1].Event, id)
	}
	h.waitSettled([]string{"user"})
	if n := h.produced(); n != 0 {
		t.Fatalf("%d events for a timeout produced already", n)
	}
}

// TestTimelineSpoolReplay: a timeout Kafka does not take is spooled, and
// replayed once Kafka takes it.
func TestTimelineSpoolReplay(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l, stop := h.startListener(h.config(ModeHybrid))
	defer stop()
	outage := h.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.NotEnoughReplicas, Count: -1})
	g := h.renew("user", "default", 300*time.Millisecond)
	waitFor(t, waitLong, "the silence to be spooled", func() bool { return l.spool.Len() == 1 })
	h.waitTimeline("user", "lapse", "spooled")
	outage.Remove()
	h.waitProduced(1)
	es := h.waitTimeline("user", "lapse", "spooled", "replayed")
	logTimeline(t, es)
	for _, e := range es {
		checkSilence(t, e, g)
	}
	if id := timeoutevent.ID("user", g.deadline.UnixMilli()); es[1].Event != id || es[2].Event != id {
		t.Errorf("spooled %q, replayed %q, want event %q", es[1].Event, es[2].Event, id)
	}
}

// TestTimelineBounded: a storm of silences of one user never makes their
// timeline longer than its bound: the newest entries stay.
func TestTimelineBounded(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeHybrid)
	const bound = 5
	cfg.Timeline.Bounds.Entries = bound
	// The renewals, a gateway's, record with the same bounds: one setting
	// for every service.
	h.store = h.store.WithHoldNotes(cfg.Timeline.HoldNotes("gateway", ""))
	stop := h.start(cfg)
	defer stop()
	h.waitSecondOfMinute(0, 30)
	h.renew("user", "default", 100*time.Millisecond)
	h.waitProduced(1)
	// Each silence after the first in the window is held by the minute
	// rule, and the next renewal cancels its hold: two entries or more
	// each.
	const silences = 8
	for range silences {
		h.renew("user", "default", 100*time.Millisecond)
		waitFor(t, waitLong, "the silence to be held", func() bool { return h.heldUIDs()["user"] })
		if n := h.storedEntries("user"); n > bound {
			t.Fatalf("timeline of %d stored entries, want at most %d", n, bound)
		}
	}
	// The last hold is the newest entry once flushed.
	es := h.waitTimelineEnd("user", "held:minute")
	if n := h.storedEntries("user"); n != bound {
		t.Fatalf("timeline %q: %d stored entries, want %d (the bound: %d silences were recorded)", steps(es), n, bound, silences+1)
	}
}

// storedEntries is how many entries uid's timeline stores: the bound
// counts these, a lapse folded into its hold or outcome once
// (timeline.Entry.Found), though it reads as two.
func (h *harness) storedEntries(uid string) int64 {
	h.t.Helper()
	n, err := h.rdb.LLen(context.Background(), h.store.Keyspace().TimelineKey(uid)).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

// waitTimelineEnd waits until uid's timeline ends with last, and
// returns it.
func (h *harness) waitTimelineEnd(uid, last string) []timeline.Entry {
	h.t.Helper()
	var got []timeline.Entry
	if !eventually(waitLong, func() bool {
		got = h.timelineOf(uid)
		s := steps(got)
		return len(s) > 0 && s[len(s)-1] == last
	}) {
		h.t.Fatalf("timeline of %s: %q, want it to end with %q", uid, steps(got), last)
	}
	return got
}
