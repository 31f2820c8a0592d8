package guide

import (
	"context"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"
)

func TestDeliversEachGuideOnce(t *testing.T) {
	e := newEnv(t)
	before := e.produce(uids("early", 10)...) // waiting when the group first joins
	r := e.start(e.cfg)
	after := e.produce(uids("late", 10)...)
	all := append(before, after...)

	e.waitShown(all)
	e.waitCommittedToEnd(e.cfg.Group)
	e.gw.checkShownOnce(t, all)
	for _, p := range all {
		if n := e.gw.attemptsFor(p.ev.ID); n != 1 {
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
	})
}

func TestUserBackIsStale(t *testing.T) {
	t.Run("before the event is read", func(t *testing.T) {
		e := newEnv(t)
		if _, err := e.store.Renew(context.Background(), "back", "default", time.Minute); err != nil {
			t.Fatal(err)
		}
		stale0, delivered0 := guidesSettled(t, OutcomeStale), guidesSettled(t, OutcomeDelivered)
		evs := e.produce("back", "gone")
		e.start(e.cfg)

		e.waitCommittedToEnd(e.cfg.Group)
		if n := e.gw.attemptsFor(evs[0].ev.ID); n != 0 {
			t.Errorf("user back in session was pushed a guide %d times", n)
		}
		if !e.gw.shown(evs[1].ev.ID) {
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
		e.gw.setMode(gatewayDown)
		stale0 := guidesSettled(t, OutcomeStale)
		ev := e.produce("returns")[0]
		e.start(e.cfg)
		waitFor(t, "a failed push", func() bool { return e.gw.attemptsFor(ev.ev.ID) > 0 })
		if _, err := e.store.Renew(context.Background(), "returns", "default", time.Minute); err != nil {
			t.Fatal(err)
		}
		e.gw.setMode(gatewayUp)

		e.waitCommittedToEnd(e.cfg.Group)
		if e.gw.shown(ev.ev.ID) {
			t.Error("user who came back during the outage was shown the guide")
		}
		if d := guidesSettled(t, OutcomeStale) - stale0; d != 1 {
			t.Errorf("stale outcomes: %v, want 1", d)
		}
	})
}

// TestOutageOpensBreakerAndHoldsOffsets: while the gateway answers 503 the
// breaker opens and no offset moves past an unsent guide; once it is back
// every guide arrives and each user sees one.
func TestOutageOpensBreakerAndHoldsOffsets(t *testing.T) {
	e := newEnv(t)
	r := e.start(e.cfg)
	first := e.produce(uids("before", 8)...)
	e.waitShown(first)
	e.waitCommittedToEnd(e.cfg.Group)
	held := e.committed(e.cfg.Group)

	errs0 := sendErrors(t)
	e.gw.setMode(gatewayDown)
	second := e.produce(uids("during", 8)...)
	// The breaker cycles open, half-open (one probe), open while the
	// outage lasts; the gauge follows it.
	waitFor(t, "the breaker and its gauge to say open", func() bool {
		return r.c.breaker.State() == gobreaker.StateOpen && breakerGauge(t) == float64(gobreaker.StateOpen)
	})
	// Through the rest of the outage nothing past the first unsent guide
	// of any partition is committed.
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if got := e.committed(e.cfg.Group); !maps.Equal(got, held) {
			t.Fatalf("committed %v during the outage, want %v held", got, held)
		}
	}
	for _, p := range second {
		if e.gw.shown(p.ev.ID) {
			t.Fatalf("guide %s shown while the gateway was down", p.ev.ID)
		}
	}
	if d := sendErrors(t) - errs0; d < float64(e.cfg.BreakerFailures) {
		t.Errorf("%v send errors counted during the outage, want at least %d", d, e.cfg.BreakerFailures)
	}

	e.gw.setMode(gatewayUp)
	all := append(first, second...)
	e.waitShown(all)
	e.waitCommittedToEnd(e.cfg.Group)
	e.gw.checkShownOnce(t, all)
	waitFor(t, "the breaker to close", func() bool { return r.c.breaker.State() == gobreaker.StateClosed })
}

// TestHangingGatewayCountsAsFailure: a gateway that never answers is cut
// off at SendTimeout, which counts toward opening the breaker.
func TestHangingGatewayCountsAsFailure(t *testing.T) {
	e := newEnv(t)
	e.gw.setMode(gatewayHang)
	r := e.start(e.cfg)
	evs := e.produce(uids("hung", 6)...)

	waitFor(t, "the breaker to open", func() bool { return r.c.breaker.State() == gobreaker.StateOpen })
	waitFor(t, "the gateway to see the consumer give up on hung pushes", func() bool {
		return e.gw.abandonedPushes() >= e.cfg.BreakerFailures
	})
	if got := e.committed(e.cfg.Group); len(got) != 0 {
		t.Errorf("committed %v while no guide was sent", got)
	}

	e.gw.setMode(gatewayUp)
	e.waitShown(evs)
	e.waitCommittedToEnd(e.cfg.Group)
	e.gw.checkShownOnce(t, evs)
}

// TestRejectedGuideIsNotRetried: a 400 settles the record for good, does
// not count against the gateway's health, and the partition moves on.
func TestRejectedGuideIsNotRetried(t *testing.T) {
	e := newEnv(t)
	e.gw.answerFor("refused", http.StatusBadRequest)
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
		if n := e.gw.attemptsFor(p.ev.ID); n != 1 {
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
}

// TestInvalidRecordsAreSkipped: records that are not timeout events this
// build can read do not block their partition.
func TestInvalidRecordsAreSkipped(t *testing.T) {
	e := newEnv(t)
	invalid0 := guidesSettled(t, OutcomeInvalid)
	bad := [][]byte{
		[]byte("\x00\xffnot json"),
		[]byte(`{"v":2,"id":"0123456789abcdef0123456789abcdef","uid":"future","deadline_ms":1}`),
		[]byte(`{"v":1,"id":"forged","uid":"someone","deadline_ms":1700000000000}`),
	}
	for _, b := range bad {
		e.produceRaw(0, "junk", b)
	}
	good := []produced{e.produceTo(0, "valid")}
	e.start(e.cfg)

	e.waitShown(good)
	e.waitCommittedToEnd(e.cfg.Group)
	if n := e.gw.totalAttempts(); n != 1 {
		t.Errorf("gateway got %d pushes, want 1 (invalid records must not be sent)", n)
	}
	if d := guidesSettled(t, OutcomeInvalid) - invalid0; d != float64(len(bad)) {
		t.Errorf("invalid outcomes: %v, want %d", d, len(bad))
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
		if n := e.gw.attemptsFor(p.ev.ID); n != 1 {
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
			if n := e.gw.attemptsFor(p.ev.ID); n != 2 {
				t.Errorf("guide %s pushed %d times, want 2", p.ev.ID, n)
			}
		}
		if d := guidesSettled(t, OutcomeDuplicate) - dup0; d != float64(len(all)) {
			t.Errorf("duplicate outcomes: %v, want %d", d, len(all))
		}
		e.gw.checkShownOnce(t, all)
	})
}

// TestStopMidPollCommitsOnlySettled: a consumer stopped while it retries a
// record commits the records settled before it and nothing after, so the
// next owner sends exactly the rest.
func TestStopMidPollCommitsOnlySettled(t *testing.T) {
	e := newEnv(t)
	e.gw.answerFor("stuck", http.StatusServiceUnavailable)
	// One partition, so the records are settled in this order.
	var evs []produced
	for _, uid := range []string{"ok-1", "ok-2", "stuck", "ok-3", "ok-4"} {
		evs = append(evs, e.produceTo(0, uid))
	}
	settled, stuck := evs[:2], evs[2]
	r1 := e.start(e.cfg)
	e.waitShown(settled)
	waitFor(t, "the stuck guide to be retried", func() bool { return e.gw.attemptsFor(stuck.ev.ID) > 1 })
	r1.stop()
	if got := e.committed(e.cfg.Group)[0]; got != stuck.offset {
		t.Errorf("stopped consumer committed partition 0 up to %d, want %d: just past the settled guides", got, stuck.offset)
	}

	e.gw.answerFor("stuck", 0)
	e.start(e.cfg)
	e.waitShown(evs)
	e.waitCommittedToEnd(e.cfg.Group)
	e.gw.checkShownOnce(t, evs)
	for _, p := range settled {
		if n := e.gw.attemptsFor(p.ev.ID); n != 1 {
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
	cfgA.PushURL = e.gw.srv.URL + "/a"
	cfgB.PushURL = e.gw.srv.URL + "/b"
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
		path := e.gw.pathOf(p.ev.ID)
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
		if path := e.gw.pathOf(p.ev.ID); path != "/b" {
			t.Errorf("guide %s sent by %s after a stopped", p.ev.ID, path)
		}
	}
	all := append(first, second...)
	for _, p := range all {
		if n := e.gw.attemptsFor(p.ev.ID); n != 1 {
			t.Errorf("guide %s pushed %d times, want 1", p.ev.ID, n)
		}
	}
	e.gw.checkShownOnce(t, all)
}
