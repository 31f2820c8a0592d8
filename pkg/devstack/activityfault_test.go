package devstack

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/activityfeed"
	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// The activity feed's faults beyond a stall (activityfeed_test.go): Kafka
// out of everyone's reach, and a member of the feed's group killed. In
// both, users are fed through the activity topic only, and the rule is
// the one a stall keeps: a silence we caused is not a silence.

// TestActivityKafkaDown: Kafka refuses every connection, of every client,
// for twice the TTL: the platform's producer buffers and retries (as
// franz-go's does), the gateway's feed cannot fetch, the listener cannot
// produce, the consumer cannot fetch. Then it comes back. Nobody active
// through the topic, nor waiting for us, is guided; each silent user is
// guided once, after Kafka is back; its timeout is produced within the
// grace after the blind interval the feed's lag recorded (the consumer,
// cut too, delivers once it has rejoined its group).
func TestActivityKafkaDown(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault of twice the TTL")
	}
	t.Parallel()
	r := newFaultRig(t, rigOptions{Gateways: 1, ActivityFeed: true, KafkaPath: true})
	p := newPlatform(t, r)
	c := newFeedCrowd(t, r, p, 8)
	c.consumerCut = true
	stopActive := c.keepActive(p)

	// Every connection to Kafka is closed, and every new one as soon as it
	// is accepted, for twice the TTL.
	down := time.Now()
	r.kafkaPath.Cut()
	time.Sleep(faultLength) // the outage lasts: real time must pass
	back := time.Now()
	r.kafkaPath.Restore()
	t.Logf("Kafka out of reach for %v", back.Sub(down).Round(time.Millisecond))

	c.settle(r)
	stopActive()
	c.check(r, down, back)

	// The platform's records of the outage were buffered, and reached
	// Kafka only after it: the cut was real for the producer too.
	if n, last := p.deliveredAfter(down, back); n == 0 {
		t.Error("no record produced during the outage was delivered after it: the platform's producer was not cut off")
	} else {
		t.Logf("%d records produced during the outage delivered after it, the last %v after Kafka was back", n, last.Sub(back).Round(time.Millisecond))
	}
}

// TestActivityFeedMemberKilled: of two gateways in the activity group,
// one is a process of its own, killed with SIGKILL while users are fed
// through the topic only: it neither leaves the group nor commits. The
// survivor takes its partitions over once the group's session timeout
// (the feed's own setting, short: feedSessionTimeout) has passed, within
// a few heartbeats after it; until then the dead member's partitions
// hold every deadline. Nobody active or waiting is guided; each silent
// user is guided once, within the grace after the blind interval of the
// lag.
func TestActivityFeedMemberKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the activity group's session timeout")
	}
	t.Parallel()
	r := newFaultRig(t, rigOptions{Gateways: 1, ActivityFeed: true})
	adm := newAdmin(t, r)
	child := r.startGatewayProcess()
	var before map[string][]int32
	waitCond(t, time.Minute, "the gateway process in the activity group, both members with partitions", func() bool {
		before = feedMembers(adm)
		if len(before) != 2 {
			return false
		}
		for _, ps := range before {
			if len(ps) == 0 {
				return false
			}
		}
		return true
	})
	p := newPlatform(t, r)
	c := newFeedCrowd(t, r, p, 8)
	stopActive := c.keepActive(p)

	// Which member is the process is known once it is gone: the member
	// that left the group.
	killed := time.Now()
	child.kill()
	var survivor string
	waitCond(t, 2*time.Minute, "the survivor to own every activity partition", func() bool {
		m := feedMembers(adm)
		if len(m) != 1 {
			return false
		}
		for id, ps := range m {
			survivor = id
			return len(ps) == 4
		}
		return false
	})
	took := time.Now()
	var dead []int32
	for id, ps := range before {
		if id != survivor {
			dead = ps
		}
	}
	t.Logf("gateway process killed; the survivor took its partitions %v over %v later (group session timeout %v)", dead, took.Sub(killed).Round(time.Millisecond), feedSessionTimeout)
	// The session timeout, a heartbeat to learn of the rebalance, the
	// rejoin, and this test's polls of the group: seconds, not the 45 s
	// of franz-go's default.
	if bound := feedSessionTimeout + 5*time.Second; took.Sub(killed) > bound {
		t.Errorf("the survivor took the partitions over %v after the kill, past the bound %v (group session timeout %v)",
			took.Sub(killed).Round(time.Millisecond), bound, feedSessionTimeout)
	}
	// The test proves something only if users of each kind were on the
	// killed member's partitions.
	for _, kind := range []string{"active", "waiting", "silent"} {
		if on := c.on(kind, dead); len(on) == 0 {
			t.Fatalf("no %s user on the killed member's partitions %v", kind, dead)
		} else {
			t.Logf("%s users on the killed member's partitions: %v", kind, on)
		}
	}

	c.settle(r)
	stopActive()
	c.check(r, killed, took)
}

// TestActivityFeedStartsWithoutKafka: the only member of the activity
// group starts while Kafka is out of its reach (the rest of the pipeline
// reaches Kafka), so it stamps nothing. The listener must know that a
// feed exists all the same: active users' records sit unread in the
// topic, so no deadline is judged until the feed has stamped. Users whose
// sessions exist already (a WebSocket or the activity API made them) are
// fed only through the topic from then on: the active ones are not
// guided; the silent ones are guided once, after the feed has stamped.
func TestActivityFeedStartsWithoutKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("an outage of three TTLs")
	}
	t.Parallel()
	r := newFaultRig(t, rigOptions{Gateways: 1})
	// The platform's topic exists: the feed, which would create it, is
	// out of Kafka's reach.
	if _, err := newAdmin(t, r).CreateTopic(context.Background(), 4, 1, nil, activityfeed.DefaultTopic); err != nil {
		t.Fatal(err)
	}
	path := startProxy(t, r.brokers)
	path.Cut()
	down := time.Now()
	env := r.gatewayEnv("gw-feed", r.redisAddrs())
	maps.Copy(env, map[string]string{
		"STILLTHERE_ACTIVITY_FEED":             "true",
		"STILLTHERE_ACTIVITY_TOPIC_PARTITIONS": "4",
		"STILLTHERE_ACTIVITY_STAMP":            "100ms",
		"STILLTHERE_ACTIVITY_GAP":              "1s",
		"STILLTHERE_KAFKA_BROKERS":             path.Addr(),
	})
	cfg, err := gateway.LoadConfig(nil, r.env(env))
	if err != nil {
		t.Fatal(err)
	}
	lifecycletest.Start(t, gateway.Open, cfg, r.log.With("service", "gateway", "instance", "gw-feed"))
	ctx := context.Background()
	store := session.NewStore(r.client(), r.keyspace())
	waitCond(t, 30*time.Second, "the feed's mark that it exists", func() bool {
		c, err := store.ActivityControl(ctx)
		return err == nil && c.ActivityUnstamped
	})

	c := &feedCrowd{t: t, n: 4, store: store}
	var last time.Time // the latest deadline of the users' sessions
	for i := range c.n {
		for _, kind := range []string{"active", "silent"} {
			d, err := store.Renew(ctx, feedUser(kind, i), session.DefaultSegment, faultTTL, session.ClockPresence)
			if err != nil {
				t.Fatal(err)
			}
			last = later(last, d)
		}
	}
	p := newPlatform(t, r)
	stopActive := c.keepActive(p)

	// Every deadline of the sessions passes, and the grace after it, while
	// the feed cannot reach Kafka: nobody is guided.
	r.waitRedisPast(last.Add(faultGrace))
	for i := range c.n {
		for _, kind := range []string{"active", "silent"} {
			if gs := r.hook.Guides(feedUser(kind, i)); len(gs) != 0 {
				t.Errorf("%s guided %v after Kafka went out of the feed's reach, before the feed stamped anything", feedUser(kind, i), gs[0].At.Sub(down).Round(time.Millisecond))
			}
		}
	}

	back := time.Now()
	path.Restore()
	waitCond(t, time.Minute, "the feed to stamp every partition", func() bool {
		c, err := store.ActivityControl(ctx)
		if err != nil || len(c.Activity) != 4 {
			return false
		}
		w, _ := c.ActivityWatermark()
		return w.After(back)
	})
	stamped := time.Now()
	t.Logf("Kafka out of the feed's reach for %v; every partition stamped %v after it was back", back.Sub(down).Round(time.Millisecond), stamped.Sub(back).Round(time.Millisecond))

	waitCond(t, 2*time.Minute, "a guide for every silent user", func() bool {
		for i := range c.n {
			if len(r.hook.Guides(feedUser("silent", i))) == 0 {
				return false
			}
		}
		return true
	})
	r.waitDrained(time.Now())
	stopActive()
	for i := range c.n {
		uid := feedUser("silent", i)
		gs := r.hook.Guides(uid)
		if len(gs) != 1 {
			t.Errorf("%s: %d guides, want 1", uid, len(gs))
			continue
		}
		if gs[0].At.Before(back) {
			t.Errorf("%s guided %v before Kafka was back", uid, back.Sub(gs[0].At).Round(time.Millisecond))
		}
		t.Logf("%s guided %v after the feed had stamped every partition", uid, gs[0].At.Sub(stamped).Round(time.Millisecond))
	}
	for i := range c.n {
		if uid := feedUser("active", i); len(r.hook.Guides(uid)) != 0 {
			t.Errorf("%s, active through the topic all along: %d guides, want 0", uid, len(r.hook.Guides(uid)))
		}
	}
}

// feedCrowd is the users of a feed fault test, each fed through the
// activity topic only: active ones act every quarter TTL until the end,
// waiting ones passed the turn to us once and nothing since, silent ones
// acted once at the start.
type feedCrowd struct {
	t     *testing.T
	n     int
	parts map[string]int32 // each user's partition of the topic
	store *session.Store
	// p keeps the active users active (keepActive); nil until then.
	p *platform
	// consumerCut: the fault cut the guide consumer from Kafka too, which
	// rejoins its group on the group's own timers once Kafka is back: the
	// guides' delivery is then not held to the grace, their production is.
	consumerCut bool
}

func feedUser(kind string, i int) string { return fmt.Sprintf("%s-%d", kind, i) }

// newFeedCrowd starts n users of each kind and waits until each has a
// session, from the topic alone.
func newFeedCrowd(t *testing.T, r *faultRig, p *platform, n int) *feedCrowd {
	t.Helper()
	c := &feedCrowd{t: t, n: n, parts: map[string]int32{}, store: session.NewStore(r.client(), r.keyspace())}
	for i := range n {
		for _, kind := range []string{"active", "silent"} {
			uid := feedUser(kind, i)
			c.parts[uid] = p.send(uid, fmt.Sprintf(`{"uid":%q,"kind":"active"}`, uid))
		}
		uid := feedUser("waiting", i)
		c.parts[uid] = p.send(uid, fmt.Sprintf(`{"uid":%q,"kind":"turn","to":"us"}`, uid))
	}
	waitCond(t, 30*time.Second, "every user's session, from the topic alone", func() bool {
		for uid := range c.parts {
			if live, err := c.store.Live(context.Background(), uid); err != nil || !live {
				return false
			}
		}
		return true
	})
	// The feed is running, not starting: it has stamped every partition
	// past the users' first events, so that a fault from now on is a lag.
	now, err := r.redisNow()
	if err != nil {
		t.Fatal(err)
	}
	waitCond(t, 30*time.Second, "the feed's watermark past the users' first events", func() bool {
		_, parts, err := c.store.ActivityWatermarks(context.Background())
		if err != nil || len(parts) != 4 {
			return false
		}
		for _, w := range parts {
			if w.Before(now) {
				return false
			}
		}
		return true
	})
	return c
}

// keepActive makes the active users act every quarter TTL, each event
// with the time it happened, as a platform that buffers would send it;
// the returned stop ends that and waits until every event is on the
// topic.
func (c *feedCrowd) keepActive(p *platform) (stop func()) {
	c.p = p
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(faultTTL / 4)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			for i := range c.n {
				uid := feedUser("active", i)
				p.produce(uid, fmt.Sprintf(`{"uid":%q,"kind":"active","at_ms":%d}`, uid, time.Now().UnixMilli()))
			}
		}
	})
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			p.flush()
		})
	}
	c.t.Cleanup(stop)
	return stop
}

// on lists the users of kind whose records go to one of parts.
func (c *feedCrowd) on(kind string, parts []int32) []string {
	var out []string
	for i := range c.n {
		if uid := feedUser(kind, i); slices.Contains(parts, c.parts[uid]) {
			out = append(out, uid)
		}
	}
	return out
}

// settle waits until the pipeline has done what it will: every silent
// user guided, then every deadline due by now judged, nothing held, and
// every timeout on the topic settled by the consumer (its guide sent, or
// found stale), so that a guide to an active or waiting user would be at
// the webhook by then.
func (c *feedCrowd) settle(r *faultRig) {
	c.t.Helper()
	waitCond(c.t, 2*time.Minute, "a guide for every silent user", func() bool {
		for i := range c.n {
			if len(r.hook.Guides(feedUser("silent", i))) == 0 {
				return false
			}
		}
		return true
	})
	r.waitDrained(time.Now())
}

// check checks who got what, for a fault from faultAt that ended at
// back: no guide for the active or the waiting; exactly one for each
// silent user, one timeout on the topic (a replay keeps its id), guided
// after back and within the grace after the end of the activity-lag blind
// interval of the fault (the latest to end after faultAt); produced
// within it, where the fault cut the consumer too (consumerCut).
func (c *feedCrowd) check(r *faultRig, faultAt, back time.Time) {
	t := c.t
	t.Helper()
	var lagEnd time.Time
	blind := r.outagesAfter(nil, nil, "").blind
	for _, b := range blind {
		if b.Reason == session.BlindActivityLag && b.End.After(faultAt) && b.End.After(lagEnd) {
			lagEnd = b.End
		}
	}
	if lagEnd.IsZero() {
		t.Errorf("no activity-lag blind interval over the fault (from %s to %s)", faultAt.Format(time.StampMilli), back.Format(time.StampMilli))
		for _, b := range blind {
			t.Logf("blind interval %s: %s to %s", b.Reason, b.Start.Format(time.StampMilli), b.End.Format(time.StampMilli))
		}
	} else {
		t.Logf("the feed's watermark passed the fault at %s, %v after it ended", lagEnd.Format(time.StampMilli), lagEnd.Sub(back).Round(time.Millisecond))
	}
	rel := func(at time.Time) string { return fmt.Sprintf("fault%+.2fs", at.Sub(faultAt).Seconds()) }
	events := r.events()
	var lates []time.Duration
	for i := range c.n {
		uid := feedUser("silent", i)
		ids := map[string]bool{}
		for _, ev := range events[uid] {
			ids[ev.ID] = true
		}
		if len(ids) != 1 {
			t.Errorf("%s: %d timeouts on the topic (%d records), want 1", uid, len(ids), len(events[uid]))
		}
		gs := r.hook.Guides(uid)
		if len(gs) != 1 {
			var at []string
			for _, g := range gs {
				at = append(at, rel(g.At))
			}
			t.Errorf("%s, silent through the fault: %d guides at %v, want 1", uid, len(gs), at)
			continue
		}
		g := gs[0]
		lates = append(lates, g.At.Sub(back))
		if g.At.Before(back) {
			t.Errorf("%s guided at %s, before the fault ended at %s", uid, rel(g.At), rel(back))
		}
		// The guide comes within the grace after the lag's blind interval
		// (and 2s for the sweep and a loaded host). Where the fault cut
		// the consumer too, it rejoins its group once Kafka is back, on
		// the group's own timers, and guides once it has (the count
		// above): then the timeout's production is held to that bound.
		bound := lagEnd.Add(faultGrace + 2*time.Second)
		if !c.consumerCut && !lagEnd.IsZero() && g.At.After(bound) {
			t.Errorf("%s guided at %s, %v past its bound %s (the grace after the lag's blind interval, ended %s)",
				uid, rel(g.At), g.At.Sub(bound).Round(time.Millisecond), rel(bound), rel(lagEnd))
		}
		if len(events[uid]) == 0 {
			continue
		}
		detected := time.UnixMilli(slices.MinFunc(events[uid], func(a, b timeoutevent.Event) int {
			return cmp.Compare(a.DetectedMS, b.DetectedMS)
		}).DetectedMS)
		if !lagEnd.IsZero() && detected.After(bound) {
			t.Errorf("%s produced at %s, %v past its bound %s (the grace after the lag's blind interval, ended %s); guided at %s",
				uid, rel(detected), detected.Sub(bound).Round(time.Millisecond), rel(bound), rel(lagEnd), rel(g.At))
		}
	}
	for i := range c.n {
		for _, kind := range []string{"active", "waiting"} {
			uid := feedUser(kind, i)
			if gs := r.hook.Guides(uid); len(gs) != 0 {
				// Active means the platform made a record for the user
				// within every TTL. If it made none in the TTL before the
				// deadline (keepActive stopped before check read the
				// guides, which a loaded host can stretch past a TTL; or
				// this process, the platform's, stalled), the user was
				// silent, whoever's doing that was: the record that set
				// the deadline is a TTL and its jitter before it. A
				// record made in the TTL, however late Kafka took it,
				// keeps the test's premise, and the guide fails it.
				g := gs[0]
				if kind == "active" && c.p != nil && !c.p.madeWithin(uid, g.Deadline.Add(-faultTTL), g.Deadline) {
					t.Logf("%s guided at %s for its deadline %s: the platform made no record for it in the TTL before, so it was silent",
						uid, rel(g.At), rel(g.Deadline))
					continue
				}
				t.Errorf("%s, %s through the topic all along: %d guides, want 0 (first at %s)", uid, kind, len(gs), rel(gs[0].At))
			} else if len(events[uid]) > 0 {
				t.Logf("%s: %d timeout events on the topic, each found stale by the consumer", uid, len(events[uid]))
			}
		}
	}
	if len(lates) > 0 {
		slices.Sort(lates)
		t.Logf("silent users guided %v to %v after the fault ended (grace %v)",
			lates[0].Round(time.Millisecond), lates[len(lates)-1].Round(time.Millisecond), faultGrace)
	}
}

// produce sends one event for uid without waiting for it, as a platform
// does: the client buffers it and retries until Kafka takes it.
func (p *platform) produce(uid, event string) {
	called := time.Now()
	rec := &kgo.Record{Key: []byte(uid), Value: []byte(event)}
	p.cl.Produce(context.Background(), rec, func(_ *kgo.Record, err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if err != nil {
			p.errs = append(p.errs, fmt.Errorf("produce for %s: %w", uid, err))
			return
		}
		p.sent = append(p.sent, delivery{uid: uid, called: called, done: time.Now()})
	})
}

// delivery is a record for uid: when it was produced, and when Kafka took
// it.
type delivery struct {
	uid          string
	called, done time.Time
}

// madeWithin reports whether the platform produced a record for uid in
// (from, to) that Kafka took.
func (p *platform) madeWithin(uid string, from, to time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.sent {
		if d.uid == uid && d.called.After(from) && d.called.Before(to) {
			return true
		}
	}
	return false
}

// flush waits until every record produced is on the topic, and fails the
// test for any that could not be.
func (p *platform) flush() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.cl.Flush(ctx); err != nil {
		p.t.Errorf("flush the platform's records: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, err := range p.errs {
		p.t.Error(err)
	}
	p.errs = nil
}

// deliveredAfter counts the records produced in [from, to) that Kafka
// took after to, and says when it took the last.
func (p *platform) deliveredAfter(from, to time.Time) (n int, last time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.sent {
		if !d.called.Before(from) && d.called.Before(to) && d.done.After(to) {
			n++
			last = later(last, d.done)
		}
	}
	return n, last
}

// newAdmin is a Kafka admin client of the rig's, closed at cleanup.
func newAdmin(t *testing.T, r *faultRig) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// feedMembers lists the activity group's members and their partitions
// of the activity topic, by member id, while the group is stable; nil
// otherwise.
func feedMembers(adm *kadm.Client) map[string][]int32 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gs, err := adm.DescribeGroups(ctx, activityfeed.DefaultGroup)
	if err != nil {
		return nil
	}
	g, ok := gs[activityfeed.DefaultGroup]
	if !ok || g.Err != nil || g.State != "Stable" {
		return nil
	}
	out := map[string][]int32{}
	for _, m := range g.Members {
		var ps []int32
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, at := range a.Topics {
				if at.Topic == activityfeed.DefaultTopic {
					ps = append(ps, at.Partitions...)
				}
			}
		}
		slices.Sort(ps)
		out[m.MemberID] = ps
	}
	return out
}

// gatewayChildEnv marks the test binary run as a gateway process.
const gatewayChildEnv = "STILLTHERE_TEST_GATEWAY_CHILD"

// TestHelperGatewayProcess is not a test of its own: run as a child of
// the test binary, it is a gateway process, with the settings of its
// environment, that a test can kill.
func TestHelperGatewayProcess(t *testing.T) {
	if os.Getenv(gatewayChildEnv) != "1" {
		t.Skip("runs only as a child process")
	}
	cfg, err := gateway.LoadConfig(nil, os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.Open(context.Background(), cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	if err := gw.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// gatewayProcess is a gateway run in a child process.
type gatewayProcess struct {
	id   string
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
}

// startGatewayProcess runs a gateway instance of the rig in a process of
// its own, reaching Redis directly, killed at cleanup if not before; its
// log is printed if the test fails.
func (r *faultRig) startGatewayProcess() *gatewayProcess {
	t := r.t
	t.Helper()
	r.mu.Lock()
	r.started++
	g := &gatewayProcess{id: fmt.Sprintf("gw-%d", r.started), done: make(chan struct{})}
	r.mu.Unlock()
	g.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperGatewayProcess$")
	// A test binary that dies takes the gateway with it.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	g.cmd.Env = append(os.Environ(), gatewayChildEnv+"=1")
	for k, v := range r.envMap(r.gatewayEnv(g.id, r.redisAddrs())) {
		g.cmd.Env = append(g.cmd.Env, k+"="+v)
	}
	var log lockedBuffer
	g.cmd.Stdout, g.cmd.Stderr = &log, &log
	if err := g.cmd.Start(); err != nil {
		t.Fatalf("start the gateway process: %v", err)
	}
	go func() { g.cmd.Wait(); close(g.done) }()
	t.Cleanup(func() {
		g.kill()
		if t.Failed() {
			t.Logf("gateway process %s log:\n%s", g.id, log.String())
		}
	})
	r.log.Info("test: gateway process up", "instance", g.id, "pid", g.cmd.Process.Pid)
	return g
}

// kill ends the process with SIGKILL, as a crash does: no drain, no
// leave, no commit; and waits until it has exited.
func (g *gatewayProcess) kill() {
	g.once.Do(func() { g.cmd.Process.Signal(syscall.SIGKILL) })
	<-g.done
}

// lockedBuffer is a buffer that a process's output and the test may use
// at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
