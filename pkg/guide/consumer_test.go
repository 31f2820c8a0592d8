package guide

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/webhook"
)

func TestDeliversEachGuideOnce(t *testing.T) {
	e := newEnv(t)
	before := e.produce(uids("early", 10)...) // waiting when the group first joins
	r := e.start(e.cfg)
	after := e.produce(uids("late", 10)...)
	all := append(before, after...)

	e.waitShown(all)
	e.waitCommittedToEnd(e.cfg.Group)
	e.checkShownOnce(t, all)
	for _, p := range all {
		if n := e.gw.Attempts(p.ev.ID); n != 1 {
			t.Errorf("guide %s pushed %d times, want 1", p.ev.ID, n)
		}
	}

	t.Run("admin", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			resp, err := http.Get("http://" + r.c.AdminAddr().String() + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s: %s", path, resp.Status)
			}
			if path == "/metrics" && !strings.Contains(string(body), `stillthere_consumer_guides_total{outcome="delivered"}`) {
				t.Errorf("/metrics does not count delivered guides")
			}
		}
		// pprof is off unless turned on: no profile or trace for whoever
		// reaches the admin port.
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/profile", "/debug/pprof/trace"} {
			resp, err := http.Get("http://" + r.c.AdminAddr().String() + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("%s with pprof off: %s, want 404", path, resp.Status)
			}
		}
	})
}

func TestUserBackIsStale(t *testing.T) {
	t.Run("before the event is read", func(t *testing.T) {
		e := newEnv(t)
		if _, err := e.store.Renew(context.Background(), "back", "default", time.Minute, session.ClockPresence); err != nil {
			t.Fatal(err)
		}
		stale0, delivered0 := guidesSettled(t, OutcomeStale), guidesSettled(t, OutcomeDelivered)
		evs := e.produce("back", "gone")
		e.start(e.cfg)

		e.waitCommittedToEnd(e.cfg.Group)
		if n := e.gw.Attempts(evs[0].ev.ID); n != 0 {
			t.Errorf("user back in session was pushed a guide %d times", n)
		}
		if !e.gw.Shown(evs[1].ev.ID) {
			t.Error("user still gone got no guide")
		}
		if d := guidesSettled(t, OutcomeStale) - stale0; d != 1 {
			t.Errorf("stale outcomes: %v, want 1", d)
		}
		if d := guidesSettled(t, OutcomeDelivered) - delivered0; d != 1 {
			t.Errorf("delivered outcomes: %v, want 1", d)
		}
	})

	// Each retry checks the session again: a user who comes back while
	// the gateway is down gets no late "are you still there?".
	t.Run("while the gateway is down", func(t *testing.T) {
		e := newEnv(t)
		e.gw.SetDown(true)
		stale0 := guidesSettled(t, OutcomeStale)
		ev := e.produce("returns")[0]
		e.start(e.cfg)
		waitFor(t, "a failed push", func() bool { return e.gw.Attempts(ev.ev.ID) > 0 })
		if _, err := e.store.Renew(context.Background(), "returns", "default", time.Minute, session.ClockPresence); err != nil {
			t.Fatal(err)
		}
		e.gw.SetDown(false)

		e.waitCommittedToEnd(e.cfg.Group)
		if e.gw.Shown(ev.ev.ID) {
			t.Error("user who came back during the outage was shown the guide")
		}
		if d := guidesSettled(t, OutcomeStale) - stale0; d != 1 {
			t.Errorf("stale outcomes: %v, want 1", d)
		}
	})
}

// TestSilenceOverIsStale: a guide is stale once its user renewed after
// its deadline, whether or not the session exists now. While the
// downstream is down, one user comes back and closes normally (their
// session is gone), another comes back and goes silent again (their
// session ran out again): neither gets the guide for the silence that is
// over. A third, silent all along, gets theirs.
func TestSilenceOverIsStale(t *testing.T) {
	e := newEnv(t)
	e.gw.SetDown(true)
	stale0 := guidesSettled(t, OutcomeStale)
	evs := e.produce("left", "silent-again", "silent")
	e.start(e.cfg)
	waitFor(t, "a failed push", func() bool { return e.gw.Attempts(evs[0].ev.ID) > 0 })
	ctx := context.Background()
	if _, err := e.store.Renew(ctx, "left", "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	if err := e.store.End(ctx, "left"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Renew(ctx, "silent-again", "default", 100*time.Millisecond, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	// Real time must pass: its new session runs out by Redis's clock.
	waitFor(t, "silent-again's new session to run out", func() bool {
		live, err := e.store.Live(ctx, "silent-again")
		return err == nil && !live
	})
	e.gw.SetDown(false)

	e.waitCommittedToEnd(e.cfg.Group)
	for _, p := range evs[:2] {
		if n := e.gw.Attempts(p.ev.ID); e.gw.Shown(p.ev.ID) {
			t.Errorf("%s was shown the guide of a silence that was over (%d attempts)", p.ev.UID, n)
		}
	}
	if !e.gw.Shown(evs[2].ev.ID) {
		t.Error("the user silent all along got no guide")
	}
	if d := guidesSettled(t, OutcomeStale) - stale0; d != 2 {
		t.Errorf("stale outcomes: %v, want 2", d)
	}
}

// TestOutageOpensBreakerAndHoldsOffsets: while the gateway answers 503 the
// breaker opens, fetching pauses on every partition, the unsent records
// are held (one probe per breaker timeout, not a retry storm) and no
// offset moves past them; once the gateway is back every guide arrives and
// each user sees one. The 15 s outage and 10 s breaker timeout are
// scaled down to a 300 ms breaker timeout and an outage of three failed
// probes.
func TestOutageOpensBreakerAndHoldsOffsets(t *testing.T) {
	e := newEnv(t)
	r := e.start(e.cfg)
	first := e.produce(uids("before", 8)...)
	e.waitShown(first)
	e.waitCommittedToEnd(e.cfg.Group)
	held := e.committed(e.cfg.Group)

	errs0, opens0 := sendErrors(t), breakerOpens(t)
	e.gw.SetDown(true)
	second := e.produce(uids("during", 8)...)
	waitFor(t, "the breaker and its gauge to say open", func() bool {
		return r.c.breaker.State() == gobreaker.StateOpen && breakerGauge(t) == float64(gobreaker.StateOpen)
	})
	waitFor(t, "every partition to be paused", func() bool {
		return slices.Equal(r.paused(), []int32{0, 1, 2, 3}) &&
			metricValue(t, "stillthere_consumer_paused_partitions") == testPartitions
	})
	waitFor(t, "a first failed probe", func() bool { return breakerOpens(t)-opens0 >= 2 })
	attempts1, errs1, opens1 := e.gw.TotalAttempts(), sendErrors(t), breakerOpens(t)
	// Through the rest of the outage nothing past the first unsent guide
	// of any partition is committed, and the records are held, not
	// retried against the open breaker.
	waitFor(t, "two more failed probes", func() bool {
		if got := e.committed(e.cfg.Group); !maps.Equal(got, held) {
			t.Fatalf("committed %v during the outage, want %v held", got, held)
		}
		return breakerOpens(t)-opens1 >= 2
	})
	probes := breakerOpens(t) - opens1
	if n := float64(e.gw.TotalAttempts() - attempts1); n > probes+1 {
		t.Errorf("%v pushes while the breaker reopened %v times: want one probe per breaker timeout", n, probes)
	}
	if n := sendErrors(t) - errs1; n > probes+1 {
		t.Errorf("%v failed attempts while the breaker reopened %v times: held records were retried", n, probes)
	}
	if d := sendErrors(t) - errs0; d < float64(e.cfg.BreakerFailures) {
		t.Errorf("%v send errors counted during the outage, want at least %d", d, e.cfg.BreakerFailures)
	}
	for _, p := range second {
		if e.gw.Shown(p.ev.ID) {
			t.Fatalf("guide %s shown while the gateway was down", p.ev.ID)
		}
	}
	waitFor(t, "the lag of the held records to be exported", func() bool {
		lag := 0.0
		for p := range testPartitions {
			lag += metricValue(t, "stillthere_consumer_lag", "partition", fmt.Sprint(p))
		}
		return lag == float64(len(second))
	})

	e.gw.SetDown(false)
	all := append(first, second...)
	e.waitShown(all)
	e.waitCommittedToEnd(e.cfg.Group)
	e.checkShownOnce(t, all)
	waitFor(t, "the breaker to close and fetching to resume", func() bool {
		return r.c.breaker.State() == gobreaker.StateClosed && len(r.paused()) == 0 &&
			metricValue(t, "stillthere_consumer_paused_partitions") == 0
	})
	// Fetching really resumed: new events go out.
	third := e.produce(uids("after", 4)...)
	e.waitShown(third)
}

// TestHangingGatewayCountsAsFailure: a gateway that never answers is cut
// off at SendTimeout, which counts toward opening the breaker; fetching
// pauses as for an outage, and nothing is lost or sent twice.
func TestHangingGatewayCountsAsFailure(t *testing.T) {
	e := newEnv(t)
	e.gw.SetHang(true)
	r := e.start(e.cfg)
	evs := e.produce(uids("hung", 6)...)

	waitFor(t, "the breaker to open", func() bool { return r.c.breaker.State() == gobreaker.StateOpen })
	waitFor(t, "every partition to be paused", func() bool { return slices.Equal(r.paused(), []int32{0, 1, 2, 3}) })
	waitFor(t, "the gateway to see the consumer give up on hung pushes", func() bool {
		return e.gw.Abandoned() >= e.cfg.BreakerFailures
	})
	if got := e.committed(e.cfg.Group); len(got) != 0 {
		t.Errorf("committed %v while no guide was sent", got)
	}

	e.gw.SetHang(false)
	e.waitShown(evs)
	e.waitCommittedToEnd(e.cfg.Group)
	e.checkShownOnce(t, evs)
	waitFor(t, "fetching to resume", func() bool { return len(r.paused()) == 0 })
}

// TestRejectedGuideIsNotRetried: a 400 settles the record for good in the
// dead-letter topic, does not count against the gateway's health, and the
// partition moves on.
func TestRejectedGuideIsNotRetried(t *testing.T) {
	e := newEnv(t)
	e.gw.SetStatus("refused", http.StatusBadRequest)
	rejected0, errs0 := guidesSettled(t, OutcomeRejected), sendErrors(t)

	// More refusals in a row than BreakerFailures, then good guides, all
	// on one partition.
	var refused, later []produced
	for range e.cfg.BreakerFailures + 1 {
		refused = append(refused, e.produceTo(0, "refused"))
	}
	for _, uid := range uids("after", 3) {
		later = append(later, e.produceTo(0, uid))
	}
	r := e.start(e.cfg)

	e.waitShown(later)
	e.waitCommittedToEnd(e.cfg.Group)
	for _, p := range refused {
		if n := e.gw.Attempts(p.ev.ID); n != 1 {
			t.Errorf("rejected guide %s pushed %d times, want 1", p.ev.ID, n)
		}
	}
	if d := guidesSettled(t, OutcomeRejected) - rejected0; d != float64(len(refused)) {
		t.Errorf("rejected outcomes: %v, want %d", d, len(refused))
	}
	if d := sendErrors(t) - errs0; d != 0 {
		t.Errorf("%v send errors: a 400 must not be retried or trip the breaker", d)
	}
	if s := r.c.breaker.State(); s != gobreaker.StateClosed {
		t.Errorf("breaker %v after rejections, want closed", s)
	}
	for _, d := range e.deadLetters(len(refused)) {
		if d.key != "refused" || !strings.Contains(d.headers[HeaderDLQReason], "400") {
			t.Errorf("dead letter %q with reason %q, want the refused guide and its status", d.key, d.headers[HeaderDLQReason])
		}
	}
}

// TestPoisonRecordsAreDeadLettered: records that are not timeout events
// this build reads go to the dead-letter topic with the reason in a
// header, and do not block the records after them on their partition.
func TestPoisonRecordsAreDeadLettered(t *testing.T) {
	e := newEnv(t)
	invalid0 := guidesSettled(t, OutcomeInvalid)
	bad := []struct {
		value  string
		reason string // in the reason header
	}{
		{"\x00\xffnot json", "decode timeout event"},
		{`{"v":3,"id":"0123456789abcdef0123456789abcdef","uid":"future","deadline_ms":1}`, "unknown timeout event version"},
		{`{"v":1,"id":"forged","uid":"someone","deadline_ms":1700000000000}`, "does not match"},
	}
	var offsets []int64
	for _, b := range bad {
		offsets = append(offsets, e.produceRaw(0, "junk", []byte(b.value)))
	}
	good := []produced{e.produceTo(0, "valid"), e.produceTo(0, "valid-2")}
	e.start(e.cfg)

	e.waitShown(good)
	e.waitCommittedToEnd(e.cfg.Group)
	if n := e.gw.TotalAttempts(); n != len(good) {
		t.Errorf("gateway got %d pushes, want %d (poison records must not be sent)", n, len(good))
	}
	if d := guidesSettled(t, OutcomeInvalid) - invalid0; d != float64(len(bad)) {
		t.Errorf("invalid outcomes: %v, want %d", d, len(bad))
	}
	dl := e.deadLetters(len(bad))
	if len(dl) != len(bad) {
		t.Fatalf("%d dead letters, want %d", len(dl), len(bad))
	}
	// Dead letters are produced concurrently: match them by source offset.
	slices.SortFunc(dl, func(a, b dlqRecord) int {
		return strings.Compare(fmt.Sprintf("%08s", a.headers[HeaderDLQOffset]), fmt.Sprintf("%08s", b.headers[HeaderDLQOffset]))
	})
	for i, d := range dl {
		if d.value != bad[i].value || d.key != "junk" {
			t.Errorf("dead letter %d: key %q value %q, want the record as read", i, d.key, d.value)
		}
		if !strings.Contains(d.headers[HeaderDLQReason], bad[i].reason) {
			t.Errorf("dead letter %d: reason %q, want it to say %q", i, d.headers[HeaderDLQReason], bad[i].reason)
		}
		if d.headers[HeaderDLQTopic] != testTopic || d.headers[HeaderDLQPartition] != "0" || d.headers[HeaderDLQOffset] != fmt.Sprint(offsets[i]) {
			t.Errorf("dead letter %d: from %s/%s@%s, want %s/0@%d", i,
				d.headers[HeaderDLQTopic], d.headers[HeaderDLQPartition], d.headers[HeaderDLQOffset], testTopic, offsets[i])
		}
	}
}

// TestTooOldIsDropped: an event whose deadline is older than
// guide-max-age is settled without a send, and counted.
func TestTooOldIsDropped(t *testing.T) {
	e := newEnv(t)
	old0 := guidesSettled(t, OutcomeTooOld)
	deadline := time.Now().Add(-e.cfg.GuideMaxAge - time.Minute).Truncate(time.Millisecond)
	ev := timeoutevent.New("late", session.DefaultSegment, deadline, deadline, timeoutevent.SourceSweep)
	b, _ := ev.Marshal()
	e.produceRaw(0, ev.UID, b)
	fresh := []produced{e.produceTo(0, "fresh")}
	e.start(e.cfg)

	e.waitShown(fresh)
	e.waitCommittedToEnd(e.cfg.Group)
	if n := e.gw.Attempts(ev.ID); n != 0 {
		t.Errorf("too old guide pushed %d times", n)
	}
	if d := guidesSettled(t, OutcomeTooOld) - old0; d != 1 {
		t.Errorf("too_old outcomes: %v, want 1", d)
	}
}

// TestTemplatesPerSegment: a segment with a template gets its text, any
// other the default.
func TestTemplatesPerSegment(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.GuideTemplates = "vip=Still with us?,new=Need a hand?"
	var evs []produced
	for _, seg := range []string{"vip", "new", "other"} {
		deadline := time.Now().Add(-time.Second).Truncate(time.Millisecond)
		ev := timeoutevent.New("user-"+seg, seg, deadline, deadline, timeoutevent.SourceSweep)
		b, _ := ev.Marshal()
		evs = append(evs, produced{ev: ev, offset: e.produceRaw(0, ev.UID, b)})
	}
	e.start(cfg)
	e.waitShown(evs)
	want := []string{"Still with us?", "Need a hand?", testText}
	slices.Sort(want)
	if got := e.gw.Texts(); !slices.Equal(got, want) {
		t.Errorf("texts sent %q, want %q", got, want)
	}
}

// TestInFlightBoundPausesFetching: with a slow downstream no more than
// max-in-flight records are taken at once, fetching pauses at the bound,
// and everything goes out once the downstream speeds up.
func TestInFlightBoundPausesFetching(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.MaxInFlight = 4
	cfg.SendTimeout = waitLong // slow, not failing: the breaker stays shut
	e.gw.SetHang(true)
	evs := e.produce(uids("many", 40)...)
	r := e.start(cfg)

	waitFor(t, "the in-flight bound to be reached and fetching paused", func() bool {
		now, _ := e.gw.Concurrency()
		return now == cfg.MaxInFlight && slices.Equal(r.paused(), []int32{0, 1, 2, 3})
	})
	if got := metricValue(t, "stillthere_consumer_in_flight"); got != float64(cfg.MaxInFlight) {
		t.Errorf("in-flight gauge %v, want %d", got, cfg.MaxInFlight)
	}
	e.gw.SetHang(false)
	e.waitShown(evs)
	e.waitCommittedToEnd(cfg.Group)
	e.checkShownOnce(t, evs)
	if _, peak := e.gw.Concurrency(); peak > cfg.MaxInFlight {
		t.Errorf("%d pushes at once, want at most max-in-flight %d", peak, cfg.MaxInFlight)
	}
	if s := r.c.breaker.State(); s != gobreaker.StateClosed {
		t.Errorf("breaker %v: a slow but answering downstream must not open it", s)
	}
}

// TestRestartResumesFromCommit: a consumer that restarts in the same group
// does not push again what was committed; one reading the topic again from
// the start (a lost commit) pushes everything again, and the gateway's
// dedupe by id still shows each user one guide.
func TestRestartResumesFromCommit(t *testing.T) {
	e := newEnv(t)
	r1 := e.start(e.cfg)
	first := e.produce(uids("one", 10)...)
	e.waitShown(first)
	e.waitCommittedToEnd(e.cfg.Group)
	r1.stop()

	second := e.produce(uids("two", 5)...)
	r2 := e.start(e.cfg)
	all := append(first, second...)
	e.waitShown(all)
	e.waitCommittedToEnd(e.cfg.Group)
	r2.stop()
	for _, p := range all {
		if n := e.gw.Attempts(p.ev.ID); n != 1 {
			t.Errorf("guide %s pushed %d times across the restart, want 1", p.ev.ID, n)
		}
	}

	t.Run("redelivery", func(t *testing.T) {
		dup0 := guidesSettled(t, OutcomeDuplicate)
		replay := e.cfg
		replay.Group = "guide-test-replay"
		e.start(replay)
		e.waitCommittedToEnd(replay.Group)
		for _, p := range all {
			if n := e.gw.Attempts(p.ev.ID); n != 2 {
				t.Errorf("guide %s pushed %d times, want 2", p.ev.ID, n)
			}
		}
		if d := guidesSettled(t, OutcomeDuplicate) - dup0; d != float64(len(all)) {
			t.Errorf("duplicate outcomes: %v, want %d", d, len(all))
		}
		e.checkShownOnce(t, all)
	})
}

// TestStopMidPollCommitsOnlySettled: a consumer stopped while it retries a
// record commits the records settled before it and nothing after, so the
// next owner sends exactly the rest.
func TestStopMidPollCommitsOnlySettled(t *testing.T) {
	e := newEnv(t)
	e.gw.SetStatus("stuck", http.StatusServiceUnavailable)
	// One partition, so the records are settled in this order.
	var evs []produced
	for _, uid := range []string{"ok-1", "ok-2", "stuck", "ok-3", "ok-4"} {
		evs = append(evs, e.produceTo(0, uid))
	}
	settled, stuck := evs[:2], evs[2]
	r1 := e.start(e.cfg)
	e.waitShown(settled)
	waitFor(t, "the stuck guide to be retried", func() bool { return e.gw.Attempts(stuck.ev.ID) > 1 })
	r1.stop()
	if got := e.committed(e.cfg.Group)[0]; got != stuck.offset {
		t.Errorf("stopped consumer committed partition 0 up to %d, want %d: just past the settled guides", got, stuck.offset)
	}

	e.gw.SetStatus("stuck", 0)
	e.start(e.cfg)
	e.waitShown(evs)
	e.waitCommittedToEnd(e.cfg.Group)
	e.checkShownOnce(t, evs)
	for _, p := range settled {
		if n := e.gw.Attempts(p.ev.ID); n != 1 {
			t.Errorf("settled guide %s pushed %d times, want 1", p.ev.ID, n)
		}
	}
}

// TestGroupSplitsAndTakesOver: two consumers share the partitions; when one
// stops the other takes its partitions over with nothing lost or sent
// twice.
func TestGroupSplitsAndTakesOver(t *testing.T) {
	e := newEnv(t)
	cfgA, cfgB := e.cfg, e.cfg
	// One recorder behind two URLs: the path a guide came on names the
	// member that sent it.
	base := strings.TrimSuffix(e.gwURL, push.Path)
	cfgA.PushURL = base + "/a"
	cfgB.PushURL = base + "/b"
	a := e.start(cfgA)
	e.start(cfgB)
	waitFor(t, "both members to own partitions", func() bool {
		n, parts := e.groupMembers(e.cfg.Group)
		return n == 2 && parts[0] > 0
	})

	first := e.produce(uids("split", 24)...)
	e.waitShown(first)
	e.waitCommittedToEnd(e.cfg.Group)
	owner := make(map[int32]string) // partition -> consumer that sent its guides
	usedBy := make(map[string]int)
	for _, p := range first {
		sent, _ := e.gw.Get(p.ev.ID)
		path := sent.Path
		usedBy[path]++
		if o, ok := owner[p.partition]; ok && o != path {
			t.Errorf("partition %d sent by both %s and %s", p.partition, o, path)
		}
		owner[p.partition] = path
	}
	if len(owner) != testPartitions || usedBy["/a"] == 0 || usedBy["/b"] == 0 {
		t.Fatalf("partitions sent by %v; want all %d split over both members", owner, testPartitions)
	}

	a.stop()
	second := e.produce(uids("takeover", 24)...)
	e.waitShown(second)
	e.waitCommittedToEnd(e.cfg.Group)
	for _, p := range second {
		if sent, _ := e.gw.Get(p.ev.ID); sent.Path != "/b" {
			t.Errorf("guide %s sent by %s after a stopped", p.ev.ID, sent.Path)
		}
	}
	all := append(first, second...)
	for _, p := range all {
		if n := e.gw.Attempts(p.ev.ID); n != 1 {
			t.Errorf("guide %s pushed %d times, want 1", p.ev.ID, n)
		}
	}
	e.checkShownOnce(t, all)
}

// TestWebhookSenderEndToEnd: with sender=webhook the consumer POSTs each
// guide, signed, to the webhook; a final answer (422) dead-letters the
// guide and a 5xx is retried.
func TestWebhookSenderEndToEnd(t *testing.T) {
	e := newEnv(t)
	secret := strings.Repeat("k", 32)
	type hook struct {
		body webhook.Body
		key  string
	}
	var mu sync.Mutex
	var got []hook
	failed := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(r.Header.Get(webhook.HeaderSignature), b, time.Now(), []byte(secret)); err != nil {
			t.Errorf("webhook: %v", err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var body webhook.Body
		json.Unmarshal(b, &body)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case body.UID == "refused":
			w.WriteHeader(http.StatusUnprocessableEntity)
		case body.UID == "flaky" && !failed[body.ID]:
			failed[body.ID] = true
			w.WriteHeader(http.StatusBadGateway)
		default:
			got = append(got, hook{body, r.Header.Get(webhook.HeaderIdempotencyKey)})
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer srv.Close()
	cfg := e.cfg
	cfg.Sender, cfg.WebhookURL, cfg.WebhookSecret = SenderWebhook, srv.URL+"/guide", secret
	cfg.GuideTemplates = "default=Hello?"
	evs := e.produce("ok", "flaky", "refused")
	e.start(cfg)

	e.waitCommittedToEnd(cfg.Group)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("webhook got %d guides, want 2: %+v", len(got), got)
	}
	for _, h := range got {
		var ev timeoutevent.Event
		for _, p := range evs {
			if p.ev.UID == h.body.UID {
				ev = p.ev
			}
		}
		want := webhook.Body{ID: ev.ID, UID: ev.UID, Segment: ev.Segment, Text: "Hello?", DeadlineMS: ev.DeadlineMS, DueMS: ev.DeadlineMS,
			Stage: 1, Action: timeoutevent.ActionRemind}
		if h.body != want || h.key != ev.ID {
			t.Errorf("webhook got %+v with key %q, want %+v with key %q", h.body, h.key, want, ev.ID)
		}
	}
	if dl := e.deadLetters(1); dl[0].key != "refused" || !strings.Contains(dl[0].headers[HeaderDLQReason], "422") {
		t.Errorf("dead letter %q, reason %q; want the refused guide", dl[0].key, dl[0].headers[HeaderDLQReason])
	}
}
