package expiry

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// The tests of "a silence we caused is not a silence": a timeout whose
// deadline fell in, or shortly after, a time users could not reach us
// waits for the grace after it, then is produced only if the user is
// still silent.

// redisNow is Redis's clock.
func (h *harness) redisNow() time.Time {
	h.t.Helper()
	now, err := h.rdb.Time(context.Background()).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	return now
}

// renewVia renews uid as gateway instance inst does.
func (h *harness) renewVia(inst, uid string, ttl time.Duration) grant {
	h.t.Helper()
	r := session.NewRenewer(h.store, session.RenewerConfig{Instance: inst})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	d, err := r.Renew(context.Background(), uid, "default", ttl, session.ClockPresence)
	if err != nil {
		h.t.Fatal(err)
	}
	return grant{segment: "default", deadline: d}
}

// heartbeat keeps gateway instance inst alive with lease until the
// returned stop is called.
func (h *harness) heartbeat(inst string, lease time.Duration) (stop func()) {
	h.t.Helper()
	if _, err := h.store.Heartbeat(context.Background(), inst, lease); err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				h.store.Heartbeat(ctx, inst, lease)
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	h.t.Cleanup(stop)
	return stop
}

// eventTimes collects, for each uid, Redis's time at which its event was
// detected: for a held timeout, its recheck.
func detectedAt(evs []timeoutevent.Event) map[string]time.Time {
	out := map[string]time.Time{}
	for _, ev := range evs {
		out[ev.UID] = time.UnixMilli(ev.DetectedMS)
	}
	return out
}

// TestBlindIntervalHolds: timeouts whose deadlines fall in a blind
// interval, or in the grace after it, wait until the grace has passed.
// Then the silent ones are produced once each; the one who came back in
// the meantime is not. The hold lives in Redis: a listener restart in the
// middle of it changes nothing.
func TestBlindIntervalHolds(t *testing.T) {
	for _, mode := range []string{ModeHybrid, ModeEvents} {
		t.Run(mode, func(t *testing.T) { testBlindIntervalHolds(t, mode) })
	}
}

// testBlindIntervalHolds is TestBlindIntervalHolds in one mode. In events
// mode the listener does not sweep, and held timeouts are released all
// the same.
func testBlindIntervalHolds(t *testing.T, mode string) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(mode)
	start := h.redisNow()
	// Users could not reach us from start to start+1s.
	if err := h.store.RecordBlind(context.Background(), session.BlindInterval{
		Start: start, End: start.Add(time.Second), Reason: "test",
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]grant{
		"in-it": h.renew("in-it", "default", 500*time.Millisecond),
		// After the interval, in the grace; well before the first
		// listener stops, so that in events mode its expired event
		// reaches that listener (events mode loses what comes while no
		// listener is subscribed).
		"in-grace": h.renew("in-grace", "default", 1200*time.Millisecond),
	}
	h.renew("back", "default", 600*time.Millisecond)
	stop := h.start(cfg)
	if mode != ModeSweep {
		h.waitSubscribed(1)
	}
	// Redis keeps the interval in whole milliseconds, and so releases
	// its holds in them.
	release := start.Truncate(time.Millisecond).Add(time.Second + testGrace)

	// All three are found and held; none is produced in the grace.
	waitFor(t, waitLong, "the three timeouts to be held, or produced", func() bool {
		held := h.heldUIDs()
		return held["in-it"] && held["in-grace"] && held["back"] || h.produced() > 0
	})
	if n := h.produced(); n != 0 {
		t.Fatalf("%d events produced during the grace", n)
	}
	stop()
	h.renew("back", "default", time.Minute) // came back while held
	stop = h.start(cfg)
	h.waitProduced(len(want))
	h.sweptPast(h.redisNow()) // and nothing more
	stop()
	evs := h.events()
	checkExactlyOnce(t, evs, want, sourcesOf(mode)...)
	for uid, at := range detectedAt(evs) {
		if at.Before(release) {
			t.Errorf("%s produced at %v, before the grace ended at %v", uid, at, release)
		}
		if at.After(release.Add(2 * time.Second)) {
			t.Errorf("%s produced at %v, more than 2s after the grace ended at %v", uid, at, release)
		}
	}
}

// TestSweepGapHolds: while no listener sweeps (all stopped), the pings of
// users might not have been recorded either (Redis down). Timeouts in the
// gap wait for the grace after it; one who pings in the grace is not
// produced.
func TestSweepGapHolds(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeSweep)
	stop := h.start(cfg)
	h.sweptPast(h.redisNow()) // a sweep is marked
	stop()
	stopped := h.redisNow()
	silent := h.renew("silent", "default", 500*time.Millisecond)
	h.renew("back", "default", 500*time.Millisecond)
	// No listener sweeps for longer than the gap allowed.
	h.untilRedis(stopped.Add(cfg.SweepGapMax + time.Second))
	restart := h.redisNow()
	stop = h.start(cfg)
	waitFor(t, waitLong, "both timeouts to be held, or produced", func() bool {
		held := h.heldUIDs()
		return held["silent"] && held["back"] || h.produced() > 0
	})
	if n := h.produced(); n != 0 {
		t.Fatalf("%d events produced right after a sweep gap", n)
	}
	h.renew("back", "default", time.Minute)
	h.waitProduced(1)
	h.sweptPast(h.redisNow()) // and nothing more
	stop()
	evs := h.events()
	checkExactlyOnce(t, evs, map[string]grant{"silent": silent}, timeoutevent.SourceSweep)
	if at := detectedAt(evs)["silent"]; at.Before(restart.Add(testGrace - 200*time.Millisecond)) {
		t.Errorf("produced at %v, before the grace after the gap (%v)", at, restart.Add(testGrace))
	}
}

// TestDeadGatewayHolds: a gateway instance dies. Its users' deadlines after
// its last heartbeat wait for the grace from then: those who reconnected
// elsewhere and pinged are not produced, those silent are, once. Users of
// the live instance are produced at once.
func TestDeadGatewayHolds(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.heartbeat("gw-live", 300*time.Millisecond)
	stopDying := h.heartbeat("gw-dying", 300*time.Millisecond)
	stop := h.start(h.config(ModeSweep))
	defer stop()

	want := map[string]grant{}
	for i := range 5 {
		uid := fmt.Sprintf("silent-%d", i)
		want[uid] = h.renewVia("gw-dying", uid, time.Second)
	}
	onLive := h.renewVia("gw-live", "on-live", 500*time.Millisecond)
	h.renewVia("gw-dying", "moved", time.Second)
	stopDying()
	died := h.redisNow()
	// On a starved machine a silent user's deadline may pass while its
	// gateway still beats: produced at once, rightly.
	early := map[string]bool{}
	for uid, g := range want {
		if g.deadline.Before(died) {
			early[uid] = true
			t.Logf("%s's deadline passed before its gateway died (the machine was slow): produced at once", uid)
		}
	}
	h.waitProduced(1)
	for _, ev := range h.events() {
		if ev.UID != "on-live" && !early[ev.UID] {
			t.Fatalf("events before the grace: %+v, want only on-live (and users whose deadline passed before the death: %v)", h.events(), early)
		}
	}
	// moved's deadline passes after its gateway died: it is held.
	waitFor(t, waitLong, "moved's timeout to be held", func() bool { return h.heldUIDs()["moved"] || h.produced() > 1 })
	h.renewVia("gw-live", "moved", time.Minute) // reconnected to the live one
	want["on-live"] = onLive
	h.waitProduced(len(want))
	h.sweptPast(h.redisNow()) // and nothing more
	evs := h.events()
	checkExactlyOnce(t, evs, want, timeoutevent.SourceSweep)
	for uid, at := range detectedAt(evs) {
		if uid != "on-live" && !early[uid] && at.Before(died.Add(testGrace-500*time.Millisecond)) {
			t.Errorf("%s produced at %v, before the grace after its gateway died (%v)", uid, at, died)
		}
	}
}

// TestDeadGatewayHoldsAtTheMargin: the listener's half of the clients'
// least margin (gateway.PingMargin). A gateway instance dies, and a user
// of its has a deadline just past the moment its missed heartbeat shows,
// a heartbeat interval and session.BeatSlack after its last: the user
// pinged a margin before it, and the ping's renewal died with the
// instance. The listener finds the deadline lapsed while the instance may
// still look alive, and must hold it, not judge it, until the grace after
// the last heartbeat. Another instance lives throughout, so that the
// fleet-down rule does not cover it.
func TestDeadGatewayHoldsAtTheMargin(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond // a heartbeat every 200 ms
	h := newHarness(t)
	h.heartbeat("gw-live", lease)
	stopDying := h.heartbeat("gw-dying", lease)
	stop := h.start(h.config(ModeSweep))
	defer stop()
	stopDying()
	if _, err := h.store.Heartbeat(context.Background(), "gw-dying", lease); err != nil {
		t.Fatal(err)
	}
	// Its last heartbeat, by Redis's clock, is no later than this.
	last := h.redisNow()
	target := last.Add(lease/3 + session.BeatSlack + 30*time.Millisecond)
	// The deadline the user's last written renewal gave, as if written
	// before the death: a renewal via the dead instance now writes the
	// same entry. At target or after it.
	g := h.renewVia("gw-dying", "pinged", max(target.Sub(h.redisNow()), time.Millisecond))
	if g.deadline.After(last.Add(testGrace - time.Second)) {
		t.Skipf("the host was too slow to place the deadline near the death: %v after the last heartbeat", g.deadline.Sub(last))
	}
	h.waitProduced(1)
	h.sweptPast(h.redisNow()) // and nothing more
	evs := h.events()
	checkExactlyOnce(t, evs, map[string]grant{"pinged": g}, timeoutevent.SourceSweep)
	if at := detectedAt(evs)["pinged"]; at.Before(last.Add(testGrace - 200*time.Millisecond)) {
		t.Errorf("produced at %v, %v after the deadline and before the grace after its gateway's last heartbeat (%v)",
			at, at.Sub(g.deadline), last.Add(testGrace))
	}
}

// TestFleetDownHolds: no gateway instance is alive (all killed, or cut
// from Redis). Every timeout waits until one is back, plus the grace.
func TestFleetDownHolds(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stopGW := h.heartbeat("gw-1", 300*time.Millisecond)
	stop := h.start(h.config(ModeSweep))
	defer stop()
	silent := h.renewVia("gw-1", "silent", 800*time.Millisecond)
	h.renewVia("gw-1", "back", 800*time.Millisecond)
	stopGW()
	// Down for longer than the grace, and swept meanwhile.
	h.sweptPast(h.redisNow().Add(2 * testGrace))
	if n := h.produced(); n != 0 {
		t.Fatalf("%d events produced while no gateway was alive", n)
	}
	back := h.redisNow()
	h.heartbeat("gw-2", 300*time.Millisecond)
	h.renewVia("gw-2", "back", time.Minute) // reconnected and pinged
	h.waitProduced(1)
	h.sweptPast(h.redisNow()) // and nothing more
	evs := h.events()
	checkExactlyOnce(t, evs, map[string]grant{"silent": silent}, timeoutevent.SourceSweep)
	if at := detectedAt(evs)["silent"]; at.Before(back.Add(testGrace - 200*time.Millisecond)) {
		t.Errorf("produced at %v, before the grace after the fleet was back (%v)", at, back.Add(testGrace))
	}
}

// TestMassExpiryBrake: 5,000 of 10,000 live sessions lapse at once, with
// no outage anyone measured. Past the threshold the brake holds them for
// the grace; each is still produced exactly once, soon after the grace
// (releaseSlack; how soon is the benchmark's), and one who pings in the
// grace is not.
func TestMassExpiryBrake(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 sessions")
	}
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeSweep)
	cfg.MassExpiryShare, cfg.MassExpiryFloor = 0.1, 100
	l, stop := h.startListener(cfg)
	defer stop()
	ctx := context.Background()
	r := session.NewRenewer(h.store, session.RenewerConfig{})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(rctx) }()
	defer func() { cancel(); <-done }()
	renewAll := func(uids []string, ttl func(int) time.Duration) map[string]grant {
		out := make(map[string]grant, len(uids))
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i, uid := range uids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := r.Renew(ctx, uid, "default", ttl(i), session.ClockPresence)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				out[uid] = grant{segment: "default", deadline: d}
				mu.Unlock()
			}()
		}
		wg.Wait()
		return out
	}
	var live, leaving []string
	for i := range 5000 {
		live = append(live, fmt.Sprintf("live-%04d", i))
		leaving = append(leaving, fmt.Sprintf("gone-%04d", i))
	}
	renewAll(live, func(int) time.Duration { return 10 * time.Minute })
	waitFor(t, waitLong, "the listener to count the live sessions", func() bool { return l.marker.sessions.Load() >= 5000 })
	want := renewAll(leaving, func(i int) time.Duration { return time.Second + time.Duration(i%500)*time.Millisecond })
	var held map[string]bool
	waitFor(t, waitLong, "the brake to hold sessions", func() bool {
		held = h.heldUIDs()
		return len(held) > 0 || h.produced() >= 5000
	})
	if n := h.produced(); n >= 4000 {
		t.Fatalf("%d of 5000 produced before the brake engaged", n)
	}
	// One of them comes back while held.
	var back string
	for _, uid := range slices.Backward(leaving) {
		if held[uid] {
			back = uid
			break
		}
	}
	cameBack := h.redisNow()
	renewAll([]string{back}, func(int) time.Duration { return 10 * time.Minute })
	wantBack := want[back]
	delete(want, back)
	h.waitProduced(len(want))
	h.sweptPast(h.redisNow()) // and nothing more
	evs := h.events()
	// On a starved machine the brake may have let back's timeout go
	// before it came back: then its guide was right, for it was gone. A
	// timeout detected after it came back is a guide to someone present.
	for _, ev := range evs {
		switch {
		case ev.UID != back:
		case ev.DetectedMS >= cameBack.UnixMilli():
			t.Errorf("%s produced at %d, after it came back at %d", back, ev.DetectedMS, cameBack.UnixMilli())
		default:
			t.Logf("%s released at %d, before it came back at %d: this run did not test a return while held", back, ev.DetectedMS, cameBack.UnixMilli())
			want[back] = wantBack
		}
	}
	checkExactlyOnce(t, evs, want, timeoutevent.SourceSweep)
	late := 0
	for _, ev := range evs {
		lag := time.Duration(ev.DetectedMS-ev.DeadlineMS) * time.Millisecond
		if lag > testGrace+releaseSlack {
			t.Errorf("%s produced %v after its deadline, want at most the grace and %v (the brake let go)", ev.UID, lag, releaseSlack)
		}
		if lag > testGrace/2 {
			late++
		}
	}
	if late == 0 {
		t.Error("nothing was held: the brake never engaged")
	}
	t.Logf("%d of %d held by the brake", late, len(want))
}

// heldUIDs lists the uids whose timeouts are held now.
func (h *harness) heldUIDs() map[string]bool {
	h.t.Helper()
	out := map[string]bool{}
	ks := h.store.Keyspace()
	for b := range session.Buckets {
		uids, err := h.rdb.ZRange(context.Background(), ks.HoldKey(b), 0, -1).Result()
		if err != nil {
			h.t.Fatal(err)
		}
		for _, uid := range uids {
			out[uid] = true
		}
	}
	return out
}

// TestReplicaThatCannotProduceStandsBy: of two listener replicas, one
// cannot produce (its Kafka path refuses records) while the other can. It
// releases what it claimed and takes no more work, so the healthy replica
// produces every timeout and nothing is spooled; it reports itself
// unready meanwhile.
func TestReplicaThatCannotProduceStandsBy(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stopA := h.start(h.config(ModeSweep))
	defer stopA()
	// The healthy replica proves itself first.
	first := h.goSilent("first", 3)
	h.waitProduced(len(first))

	bad := startKafka(t)
	bad.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.UnknownServerError, Count: -1})
	cfgB := h.config(ModeSweep)
	cfgB.Kafka.Brokers = bad.ListenAddrs()
	b, stopB := h.startListener(cfgB)
	defer stopB()

	want := h.goSilent("user", 40)
	maps.Copy(want, first)
	h.waitProduced(len(want))
	h.waitSettled(slices.Collect(maps.Keys(want)))
	if n := b.spool.Len(); n != 0 {
		t.Errorf("the replica that cannot produce spooled %d events", n)
	}
	if err := b.ready(context.Background()); err == nil {
		t.Error("the replica that cannot produce reports itself ready")
	}
	stopB()
	stopA()
	checkExactlyOnce(t, h.events(), want, timeoutevent.SourceSweep)
}

// TestClockJumpIsBlind: Redis's clock moves further between two sweeps
// than the listener's (a step, as the marker sees it when its last reply
// appears a minute older), and the time in between is a blind interval.
// A Redis that was paused is not a step: both clocks ran on.
func TestClockJumpIsBlind(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l, stop := h.startListener(h.config(ModeSweep))
	defer stop()
	waitFor(t, waitLong, "a first mark", func() bool { _, ok := l.marker.current(); return ok })
	m := l.marker
	m.mu.Lock()
	m.lastSeen = m.lastSeen.Add(-time.Minute) // Redis's clock stepped a minute ahead
	m.mu.Unlock()
	var found *session.BlindInterval
	waitFor(t, waitLong, "a clock-jump blind interval", func() bool {
		c, _ := m.current()
		for _, b := range c.Blind {
			if b.Reason == session.BlindClockJump {
				found = &b
				return true
			}
		}
		return false
	})
	if d := found.End.Sub(found.Start); d < time.Minute || d > time.Minute+5*time.Second {
		t.Errorf("clock-jump interval lasts %v, want about the step, a minute", d)
	}

	h.srv.Pause()
	// Real time must pass: Redis is paused for longer than a sweep gap,
	// and cannot be asked the time meanwhile.
	time.Sleep(2 * time.Second)
	h.srv.Resume()
	waitFor(t, waitLong, "a sweep-gap blind interval after the pause", func() bool {
		c, _ := m.current()
		for _, b := range c.Blind {
			if b.Reason == session.BlindSweepGap {
				return true
			}
		}
		return false
	})
	c, _ := m.current()
	n := 0
	for _, b := range c.Blind {
		if b.Reason == session.BlindClockJump {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d clock-jump intervals after a pause, want only the one step: %+v", n, c.Blind)
	}
}

// TestBrakeHoldsLaterStages: a close stage falls due while the mass-expiry
// brake is engaged. It is held for the grace as the first stages of the
// storm are: the user who answers their reminder in the grace keeps their
// chat, and the one still silent is closed once, after the grace.
func TestBrakeHoldsLaterStages(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	p := policy.Policy{
		DefaultTTL: 10 * time.Second,
		SegmentStages: map[string][]policy.Stage{
			"default": {{Action: timeoutevent.ActionRemind}},
			"slow": {
				{Action: timeoutevent.ActionRemind},
				{After: 3 * time.Second, Action: timeoutevent.ActionClose, Text: "We closed this chat."},
			},
		},
	}
	h.savePolicy(p)
	stop := h.start(h.brakeConfig(ModeSweep))
	defer stop()

	h.renew("answers", "slow", 300*time.Millisecond)
	silent := h.renew("silent", "slow", 300*time.Millisecond)
	waitFor(t, waitLong, "both reminders", func() bool {
		by := byUID(h.events())
		return len(by["answers"]) == 1 && len(by["silent"]) == 1
	})
	first := byUID(h.events())["silent"][0]
	if first.Stage != 1 {
		t.Fatalf("first event %+v, want stage 1", first)
	}
	// Their close is due 3s after the reminder was found due. A storm of
	// 200 lapses a second before it engages the brake.
	closeDue := time.UnixMilli(max(first.DueMS, first.DetectedMS)).Add(3 * time.Second)
	stormTTL := closeDue.Add(-time.Second).Sub(h.redisNow())
	if stormTTL < 200*time.Millisecond {
		t.Fatalf("the reminders came too late to storm before the close (%v left)", stormTTL)
	}
	storm := h.storm("storm", 200, stormTTL)
	// "answers" comes back after their close fell due, within the grace.
	h.untilRedis(closeDue.Add(500 * time.Millisecond))
	h.renew("answers", "slow", 10*time.Minute)
	waitFor(t, waitLong, "silent's close", func() bool { return len(byUID(h.events())["silent"]) == 2 })
	h.waitProduced(2 + 1 + len(storm))
	h.sweptPast(h.redisNow()) // and nothing more
	evs := h.events()
	by := byUID(evs)
	if got := by["answers"]; len(got) != 1 {
		t.Fatalf("answers got %d events %+v: closed while the brake was engaged, though they answered in the grace", len(got), got)
	}
	closing := by["silent"][1]
	if closing.Stage != 2 || !closing.Final || closing.DeadlineMS != silent.deadline.UnixMilli() {
		t.Fatalf("silent's second event %+v, want the close stage", closing)
	}
	if at := time.UnixMilli(closing.DetectedMS); at.Before(closeDue.Add(testGrace - 200*time.Millisecond)) {
		t.Fatalf("silent closed at %v, %v after due: not held for the grace", at, at.Sub(closeDue))
	}
	checkStorm(t, by, storm)
}

// TestBrakeReleasesAGraceAfterTheDeadline: the brake holds a timeout until
// the grace after it was due, not after it was found: a storm that keeps
// the listener busy must not add its own delay to the grace. One found
// more than a grace late is still held until the next sweep, and checked
// again then.
func TestBrakeReleasesAGraceAfterTheDeadline(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l, err := Open(context.Background(), h.config(ModeSweep), testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h.renew("late", "default", 100*time.Millisecond)
	h.renew("very-late", "default", 100*time.Millisecond)
	ctx := context.Background()
	var due []session.Expired
	waitFor(t, waitLong, "both deadlines to pass", func() bool {
		due, _, err = h.store.Due(ctx, 10)
		return err != nil || len(due) >= 2
	})
	if err != nil || len(due) != 2 {
		t.Fatalf("due: %+v, %v", due, err)
	}
	now := h.redisNow()
	for i := range due {
		if due[i].UID == "very-late" {
			due[i].Due = due[i].Due.Add(-testGrace - time.Second) // as if found a grace late
			if err := h.rdb.ZAdd(ctx, h.store.Keyspace().IndexKey(session.Bucket("very-late")),
				redis.Z{Score: float64(due[i].Due.UnixMilli()), Member: "very-late"}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.holdBraked(ctx, due, now); err != nil {
		t.Fatal(err)
	}
	for _, e := range due {
		release, err := h.rdb.ZScore(ctx, h.store.Keyspace().HoldKey(session.Bucket(e.UID)), e.UID).Result()
		if err != nil {
			t.Fatalf("%s not held: %v", e.UID, err)
		}
		want := e.Due.Add(testGrace)
		if e.UID == "very-late" {
			want = now.Add(l.cfg.SweepInterval)
		}
		if got := time.UnixMilli(int64(release)); got.UnixMilli() != want.UnixMilli() {
			t.Errorf("%s (due %v, found %v later) released at %v, want %v", e.UID, e.Due, now.Sub(e.Due), got, want)
		}
	}
}
