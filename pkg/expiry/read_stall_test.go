package expiry

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// A read of the deadlines that stalls: a master of a Redis Cluster other
// than the control keys' one holds its writes (CLIENT PAUSE WRITE, as a
// graceful failover does) while the marks on the {ctl} master go on, so
// no sweep gap shows. Users' renewals to that master hang as long; their
// pings land only after it answers, and their gateways record the outage
// only then. The listener's read that stalled (longer than stallMin)
// makes the deadlines that fell in it wait stallSettle, and then they are
// judged again (the hour run's ws-000). Every round trip of the
// listener's client is timed (stall.go).

// stallVictim picks a master that does not hold the control keys, and n
// uids whose bucket (index, session and dedup keys) it serves.
func (h *harness) stallVictim(n int) (victim int, uids []string) {
	h.t.Helper()
	ks := h.store.Keyspace()
	victim = (h.masterOf(ks.AliveKey()) + 1) % len(h.cluster.Masters)
	for i := 0; len(uids) < n; i++ {
		uid := fmt.Sprintf("u-%d", i)
		if h.masterOf(ks.IndexKey(session.Bucket(uid))) == victim {
			uids = append(uids, uid)
		}
	}
	return victim, uids
}

// pauseWrites makes master i hold every write (scripts included) for d,
// as a graceful failover does on the master it demotes.
func (h *harness) pauseWrites(i int, d time.Duration) {
	h.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: h.cluster.Masters[i].Addr})
	defer c.Close()
	if err := c.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "WRITE").Err(); err != nil {
		h.t.Fatal(err)
	}
}

// stallModes are the listener's paths the tests run: the sweep alone, and
// the read-ahead (hybrid: timers, the safety sweep and expired events).
var stallModes = []struct {
	name     string
	prefetch bool
}{
	{"sweep", false},
	{"prefetch", true},
}

func stallConfig(h *harness, prefetch bool) Config {
	cfg := h.config(ModeHybrid)
	if !prefetch {
		cfg.Mode, cfg.PrefetchInterval = ModeSweep, 0
	}
	return cfg
}

// checkStallHeld waits until back's and silent's timeouts are held or
// more than before events are produced, fails if any was produced, then
// lets back's ping land and checks that silent alone is guided, once.
func (h *harness) checkStallHeld(before int64, back, silent string, deadline time.Time, want map[string]grant, what string) {
	t := h.t
	t.Helper()
	waitFor(t, waitLong, "the timeouts to be held, or produced", func() bool {
		held := h.heldUIDs()
		return held[back] && held[silent] || h.produced() > before
	})
	if n := h.produced() - before; n != 0 {
		for _, ev := range h.events() {
			if ev.UID == back || ev.UID == silent {
				t.Errorf("%s: %s guided (deadline %s, detected %v after it) though its ping was on its way",
					what, ev.UID, time.UnixMilli(ev.DeadlineMS).Format("15:04:05.000"),
					time.Duration(ev.DetectedMS-ev.DeadlineMS)*time.Millisecond)
			}
		}
		var blind []string
		for _, b := range h.blindList(context.Background()) {
			blind = append(blind, fmt.Sprintf("%s %s..%s", b.Reason, b.Start.Format("15:04:05.000"), b.End.Format("15:04:05.000")))
		}
		t.Fatalf("blind intervals recorded: %q", blind)
	}
	// The user's ping, sent during the stall, lands.
	h.renew(back, "default", time.Minute)
	h.waitProduced(int(before) + 1)
	h.sweptPast(h.redisNow())
	want[silent] = grant{segment: "default", deadline: deadline}
	checkExactlyOnce(t, h.events(), want, timeoutevent.SourceSweep, timeoutevent.SourceEvent)
}

// TestReadStallHolds: at the default sweep-gap-max (2 s), a stall of
// 1.5 s, beginning 0.4 s before two users' deadlines: no sweep gap, and
// longer than a gateway's renewal round trip may take before it counts as
// an outage (1 s), so the users' pings were held up past their deadlines.
// Both timeouts wait; the one whose ping lands meanwhile is not guided,
// the silent one is, once. In sweep mode the stalled read finds them; with
// the prefetch path, a timer's confirm or a window read that only sets
// timers stalls, and the fire after it finds them.
func TestReadStallHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster pause")
	}
	t.Parallel()
	for _, tc := range stallModes {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newClusterHarness(t, false)
			victim, uids := h.stallVictim(2)
			back, silent := uids[0], uids[1]
			cfg := stallConfig(h, tc.prefetch)
			cfg.SweepGapMax = DefaultConfig().SweepGapMax
			stop := h.start(cfg)
			defer stop()
			h.sweptPast(h.redisNow())

			const ttl = 1200 * time.Millisecond
			h.renew(back, "default", ttl)
			deadline := h.renew(silent, "default", ttl).deadline
			h.untilRedis(deadline.Add(-400 * time.Millisecond))
			h.pauseWrites(victim, 1500*time.Millisecond)

			h.checkStallHeld(0, back, silent, deadline, map[string]grant{},
				fmt.Sprintf("a stall of 1.5 s at sweep-gap-max %v", cfg.SweepGapMax))
		})
	}
}

// stallProxy forwards TCP connections to a target, and stalls every byte
// both ways while stalled: a hiccup of one host's network path (TCP
// retransmissions on a lossy link back off to seconds), which nobody else
// shares.
type stallProxy struct {
	ln     net.Listener
	target string
	gate   atomic.Pointer[chan struct{}] // non-nil while stalled
	mu     sync.Mutex
	conns  []net.Conn
}

func (h *harness) startStallProxy(target string) *stallProxy {
	h.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	go p.accept()
	h.t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

func (p *stallProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

func (p *stallProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if g := p.gate.Load(); g != nil {
				<-*g
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) stall() {
	g := make(chan struct{})
	p.gate.Store(&g)
}

func (p *stallProxy) resume() {
	if g := p.gate.Swap(nil); g != nil {
		close(*g)
	}
}

func (p *stallProxy) close() {
	p.resume()
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// TestAttackOneReplicasStallHoldsEveryone: of two listener replicas, one
// loses its network path to Redis for 1.5 s (a hiccup of its host alone);
// Redis, the other replica and every gateway are fine, and users reach
// us all along. The replica's read of the deadlines stalled. Were that
// recorded as a blind interval of everyone, a user who falls silent just
// after would be held for the grace (75 s by default) by both replicas,
// instead of guided on time by the healthy one: one replica's measure of
// its own read would become everyone's outage, and a replica whose path
// stays slow would make every guide late by the grace. The stall is the
// replica's own: at most its own finds wait stallSettle, and nothing is
// recorded.
func TestAttackOneReplicasStallHoldsEveryone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfgB := h.config(ModeSweep)
	cfgB.OutageGrace = 30 * time.Second // a hold for the grace shows
	stopB := h.start(cfgB)
	defer stopB()
	p := h.startStallProxy(h.srv.Addr)
	cfgA := h.config(ModeSweep)
	cfgA.OutageGrace = cfgB.OutageGrace
	cfgA.Redis.Addrs = []string{p.addr()}
	stopA := h.start(cfgA)
	defer stopA()
	h.sweptPast(h.redisNow())

	const hiccup = 1500 * time.Millisecond
	p.stall()
	start := h.redisNow()
	// silent's deadline falls just after the hiccup: nobody was blind then.
	g := h.renew("silent", "default", hiccup+400*time.Millisecond)
	// Real time must pass for the hiccup to last.
	h.untilRedis(start.Add(hiccup))
	p.resume()

	h.waitProduced(1)
	h.sweptPast(h.redisNow())
	stopA()
	stopB()
	if blind := h.blindList(context.Background()); len(blind) > 0 {
		t.Errorf("one replica's stall recorded for everyone: %v", blind)
	}
	evs := h.events()
	checkExactlyOnce(t, evs, map[string]grant{"silent": g}, timeoutevent.SourceSweep)
	for _, ev := range evs {
		if late := time.Duration(ev.DetectedMS-ev.DeadlineMS) * time.Millisecond; late > stallSettle+time.Second {
			t.Errorf("silent guided %v after its deadline, past the stalled replica's own wait (%v)", late, stallSettle)
		}
	}
}

// TestAttackStallDuringEmitIsNotCounted: the stall begins while the
// listener's pipeline is carrying a batch out (its claims, produce, dedup
// marks and settles), not reading the deadlines. Its own writes to the
// paused master hang as long as the users' renewals, and once they return
// the next read of the deadlines is quick. Were only reads timed, the
// deadlines that fell in the stall would be guided at once; every round
// trip is (stallHook). In a storm the pipeline spends most of its time in
// emit, so a stall is more likely to begin there than in a read. (Kafka
// holds the first batch's produce only to put the pipeline in emit when
// the pause begins; it answers at once after.)
func TestAttackStallDuringEmitIsNotCounted(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster pause")
	}
	t.Parallel()
	for _, tc := range stallModes {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newClusterHarness(t, false)
			victim, uids := h.stallVictim(3)
			first, back, silent := uids[0], uids[1], uids[2]

			inProduce := make(chan struct{})
			paused := make(chan struct{})
			var once atomic.Bool
			h.kafka.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				if once.CompareAndSwap(false, true) {
					close(inProduce)
					h.kafka.SleepControl(func() { <-paused })
				}
				return nil, nil, false
			})

			stop := h.start(stallConfig(h, tc.prefetch))
			defer stop()
			h.sweptPast(h.redisNow())

			g := h.renew(first, "default", 300*time.Millisecond)
			select {
			case <-inProduce:
			case <-time.After(waitLong):
				t.Fatal("the first timeout never reached Kafka")
			}
			// The pipeline is in emit, claimed first's key, and waits for
			// Kafka. The others' deadlines fall in the stall.
			const ttl = 400 * time.Millisecond
			h.renew(back, "default", ttl)
			deadline := h.renew(silent, "default", ttl).deadline
			h.pauseWrites(victim, 1600*time.Millisecond) // past sweep-gap-max (1 s)
			// Kafka takes first's event: the listener's dedup mark and
			// settle of it now wait on the paused master.
			close(paused)

			h.checkStallHeld(1, back, silent, deadline,
				map[string]grant{first: g}, "a stall of 1.6 s while the listener's emit waited on the paused master")
		})
	}
}

// TestAttackEventsModeStallNothingReleased: in events mode the pipeline
// reads the hold sets (recheckReleased) every tick, and that read hangs
// in the stall like the sweep's; but it marks only when it found
// something released, and it found nothing. The expired events of the
// deadlines that fell in the stall come once the master expires keys
// again, and their lookups are quick; the stall, timed on the read that
// hung, holds them all the same.
func TestAttackEventsModeStallNothingReleased(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster pause")
	}
	t.Parallel()
	h := newClusterHarness(t, false)
	victim, uids := h.stallVictim(2)
	back, silent := uids[0], uids[1]
	stop := h.start(h.config(ModeEvents))
	defer stop()
	h.waitSubscribed(1)
	h.sweptPast(h.redisNow())

	const ttl = 1200 * time.Millisecond
	h.renew(back, "default", ttl)
	deadline := h.renew(silent, "default", ttl).deadline
	h.untilRedis(deadline.Add(-400 * time.Millisecond))
	h.pauseWrites(victim, 1600*time.Millisecond) // past sweep-gap-max (1 s)

	h.checkStallHeld(0, back, silent, deadline, map[string]grant{},
		"events mode, a stall of 1.6 s")
}

// TestStallInterval: round trips that stalled are placed by Redis's clock
// from stallMin before the first began to the last's end; those that did
// not stall are not noted.
func TestStallInterval(t *testing.T) {
	at := time.Unix(1000, 0)         // this host's clock at the mark's reply
	now := time.UnixMilli(5_000_000) // Redis's then
	var w stallWindow
	w.note(at.Add(-300*time.Millisecond), at.Add(-100*time.Millisecond)) // 200 ms: no stall
	if s, _ := w.take(); !s.IsZero() {
		t.Fatalf("a round trip of 200 ms noted as a stall from %v", s)
	}
	w.note(at.Add(-3*time.Second), at.Add(-2*time.Second))               // 1 s
	w.note(at.Add(-2500*time.Millisecond), at.Add(-1*time.Second))       // 1.5 s, overlapping
	w.note(at.Add(-400*time.Millisecond), at.Add(-350*time.Millisecond)) // 50 ms: not widening it
	start, end := w.take()
	b := stallInterval(start, end, now, at)
	if want := now.Add(-3*time.Second - stallMin); !b.Start.Equal(want) {
		t.Errorf("start %v, want %v", b.Start, want)
	}
	if want := now.Add(-time.Second); !b.End.Equal(want) {
		t.Errorf("end %v, want %v", b.End, want)
	}
	if b.Reason != session.BlindReadStall {
		t.Errorf("reason %q", b.Reason)
	}
	if s, _ := w.take(); !s.IsZero() {
		t.Errorf("take left %v", s)
	}
}
