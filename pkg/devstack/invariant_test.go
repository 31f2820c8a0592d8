package devstack

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/session"
)

// The invariant test drives a random schedule over the real stack (two
// gateway instances, the listener, the consumer sending to a webhook)
// with a TTL of 2s: simulated users ping, go silent, come back, leave
// with 1000, lose their network, reconnect and open a second device,
// while the webhook fails for seconds at a time and the listener and
// the consumer are restarted. Then it checks what the webhook showed
// against what the users' clients saw:
//
//   - every silence gets its guide, by its bound: the deadline, or the
//     end of its UTC minute when another silence of that minute came
//     first, pushed past whatever outage it met, plus the pipeline's
//     slack;
//   - no guide reaches a user who renewed (or left) after its deadline,
//     allowing for a ping in flight while the guide was;
//   - no guide for a deadline the user renewed or left before;
//   - one guide per silence, one id per guide, the id the silence's own;
//   - at most one guide of a minute's deadlines arrives before the
//     minute ends (the others are deferred to its end).
//
// STILLTHERE_INVARIANT_SEED (a number, or "random") and
// STILLTHERE_INVARIANT_DURATION choose another schedule, for
// exploration; a failing run prints how to replay it. The same seed
// makes the same choices; their timing, and so the interleavings, vary.
const (
	invSeedEnv     = "STILLTHERE_INVARIANT_SEED"
	invDurationEnv = "STILLTHERE_INVARIANT_DURATION"
	// invSeed and invDuration are CI's schedule. The schedule is
	// stretched by up to 45s so that it ends in the second half of a UTC
	// minute (the deferred guides of its last silences then come soon),
	// and by a minute more if no minute turns in it early enough.
	invSeed     = 13
	invDuration = 45 * time.Second
	invUsers    = 48
	// invStaleSlack is the in-flight ambiguity: a guide whose session
	// check ran just before the user's renewal reaches the webhook this
	// long after the renewal's pong at most.
	invStaleSlack = 750 * time.Millisecond
	// invEndLag: the gateway answers a normal close before its route
	// write ends the session.
	invEndLag = time.Second
	// invPongWait bounds the wait for a pong; a ping without one may
	// have renewed, or not.
	invPongWait = 3 * time.Second
	// invLatency is how long a guide normally takes past its deadline:
	// an outage starting within it delays the guide.
	invLatency = time.Second
	// invPingSpacing is the least time between two pings of a user.
	invPingSpacing = 1100 * time.Millisecond
	// invEps absorbs the deadline's rounding to milliseconds.
	invEps = 5 * time.Millisecond
)

func TestInvariantsUnderRandomSchedule(t *testing.T) {
	if testing.Short() {
		t.Skip("a random schedule of a minute or more over the whole pipeline")
	}
	seed, dur := invariantParams(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("failing schedule: %s=%d %s=%v", invSeedEnv, seed, invDurationEnv, dur)
		}
	})
	p := newPipelineRig(t, pipelineOptions{Gateways: 2, Sender: guide.SenderWebhook})
	r := &invRun{t: t, p: p, seed: seed, start: time.Now()}
	r.end = alignEnd(r.start, r.start.Add(dur))
	t.Logf("seed %d, schedule %v (%v asked, stretched to end in the second half of a minute), %d users",
		seed, r.end.Sub(r.start).Round(time.Second), dur, invUsers)
	r.play()
	r.check()
}

// invariantParams reads the seed and duration, from the environment
// when set.
func invariantParams(t *testing.T) (uint64, time.Duration) {
	seed, dur := uint64(invSeed), invDuration
	switch v := os.Getenv(invSeedEnv); v {
	case "":
	case "random":
		seed = uint64(time.Now().UnixNano())
	default:
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want a number, or random", invSeedEnv, v)
		}
		seed = n
	}
	if v := os.Getenv(invDurationEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Second {
			t.Fatalf("%s=%q: want a duration of at least 10s", invDurationEnv, v)
		}
		dur = d
	}
	return seed, dur
}

// alignEnd moves end forward to the next time in seconds 30 to 45 of a
// UTC minute that a minute's turn at least 8s after start precedes: the
// disruptions fail the downstream across such a turn (see disrupt), and
// a schedule started in the last seconds of a minute had none.
func alignEnd(start, end time.Time) time.Time {
	s := end.Sub(end.Truncate(time.Minute))
	switch {
	case s < 30*time.Second:
		end = end.Add(30*time.Second - s)
	case s > 45*time.Second:
		end = end.Add(90*time.Second - s)
	}
	if end.Truncate(time.Minute).Before(start.Add(8 * time.Second)) {
		end = end.Add(time.Minute)
	}
	return end
}

// invRun is one run of the schedule.
type invRun struct {
	t          *testing.T
	p          *pipelineRig
	seed       uint64
	start, end time.Time
	users      []*invUser
	readers    sync.WaitGroup // the devices' readers

	mu          sync.Mutex
	disruptions []disruption
}

// disruption is a time the pipeline was partly out: the webhook failing,
// or a service restarting. A guide due within it may come up to extra
// after its end.
type disruption struct {
	kind       string
	start, end time.Time // end is zero while it lasts
	extra      time.Duration
}

// Kinds of disruption.
const (
	disDownstream = "downstream"
	disListener   = "listener-restart"
	disConsumer   = "consumer-restart"
)

// play runs the users and the disruptions until the schedule ends and
// every user has finished its last silence.
func (r *invRun) play() {
	var wg sync.WaitGroup
	for i := range invUsers {
		u := &invUser{
			run: r,
			uid: fmt.Sprintf("inv-%02d", i),
			rng: rand.New(rand.NewPCG(r.seed, uint64(i)+1)),
		}
		u.sim = &chatsim.User{
			UID:     u.uid,
			Token:   mintFor(r.p.faultRig, u.uid),
			Dialer:  &websocket.Dialer{HandshakeTimeout: 2 * time.Second},
			Readers: &r.readers,
		}
		r.users = append(r.users, u)
		wg.Go(u.play)
	}
	wg.Go(func() { r.disrupt(rand.New(rand.NewPCG(r.seed, 0))) })
	wg.Wait()
	r.readers.Wait()
	// A late guide, stale or not, would have arrived once the pipeline
	// is done with every deadline so far.
	r.p.waitDrained(time.Now())
}

// disrupt fails the downstream and restarts the listener and the
// consumer, one at a time, every few seconds until the schedule ends,
// each kind at least once. The webhook fails for 10s across every turn
// of a minute: each user's first deadline of the new minute is produced
// at once (later ones may wait for the minute's end), so lapses then
// leave guides waiting on a consumer that cannot send them.
func (r *invRun) disrupt(rng *rand.Rand) {
	owed := []string{disDownstream, disListener, disConsumer}
	rng.Shuffle(len(owed), func(i, j int) { owed[i], owed[j] = owed[j], owed[i] })
	all := []string{disDownstream, disListener, disConsumer}
	next := r.start.Add(4 * time.Second)
	for {
		turn := next.Truncate(time.Minute).Add(time.Minute)
		atTurn := turn.Add(-2*time.Second).Sub(next) < 8*time.Second
		if atTurn {
			next = later(next, turn.Add(-2*time.Second))
		}
		time.Sleep(time.Until(next)) // real time: the schedule's next disruption
		if time.Now().After(r.end.Add(-5 * time.Second)) {
			return
		}
		kind, length := all[rng.IntN(len(all))], time.Duration(2+rng.IntN(7))*time.Second
		switch {
		case atTurn:
			kind, length = disDownstream, 10*time.Second
		case len(owed) > 0:
			kind = owed[0]
		}
		owed = slices.DeleteFunc(owed, func(k string) bool { return k == kind })
		switch kind {
		case disDownstream:
			d := r.begin(kind, 1500*time.Millisecond)
			heal := r.p.failDownstream()
			time.Sleep(length) // real time: the outage lasts this long
			heal()
			r.finish(d)
		case disListener:
			d := r.begin(kind, faultGrace+500*time.Millisecond)
			if err := r.p.restartListener(); err != nil {
				r.t.Errorf("restart listener: %v", err)
			}
			r.finish(d)
		case disConsumer:
			d := r.begin(kind, 3*time.Second)
			if err := r.p.restartConsumer(); err != nil {
				r.t.Errorf("restart consumer: %v", err)
			}
			r.finish(d)
		}
		next = time.Now().Add(time.Duration(3000+rng.IntN(5000)) * time.Millisecond)
	}
}

// failing tells whether the webhook is failing now.
func (r *invRun) failing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.disruptions {
		if d.kind == disDownstream && d.end.IsZero() {
			return true
		}
	}
	return false
}

func (r *invRun) begin(kind string, extra time.Duration) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.disruptions = append(r.disruptions, disruption{kind: kind, start: time.Now(), extra: extra})
	return len(r.disruptions) - 1
}

func (r *invRun) finish(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.disruptions[i].end = time.Now()
}

// bound is when the guide of a silence whose deadline is at most high
// must have arrived: at the deadline, or the end of its minute when it
// may be deferred, moved past every disruption it met, plus the slack.
// A disruption still under way counts as ending now.
func (r *invRun) bound(high time.Time, deferrable bool) time.Time {
	b := high
	if deferrable {
		b = later(b, session.DedupWindowEnd(high))
	}
	r.mu.Lock()
	ds := append([]disruption(nil), r.disruptions...)
	r.mu.Unlock()
	now := time.Now()
	for changed := true; changed; {
		changed = false
		for _, d := range ds {
			end := d.end
			if end.IsZero() {
				end = now
			}
			if d.start.After(b.Add(invLatency)) {
				continue
			}
			if nb := end.Add(d.extra); nb.After(b) {
				b, changed = nb, true
			}
		}
	}
	return b.Add(guideSlack)
}

// rel is t relative to the run's start, for reports.
func (r *invRun) rel(t time.Time) string {
	switch {
	case t.IsZero():
		return "-"
	case t.After(r.end.Add(30 * time.Minute)):
		return "never"
	}
	return fmt.Sprintf("%+.3fs", t.Sub(r.start).Seconds())
}

// invUser is one simulated user. Its goroutine does one thing at a time
// (a ping waits for its pong before anything else happens), so its
// renewals reach Redis in the order it sent them, and the deadline is
// always the last confirmed ping's. Its fields are the goroutine's; the
// checker reads them once it has returned.
type invUser struct {
	run *invRun
	uid string
	sim *chatsim.User // its client, whose dials and answers these are
	rng *rand.Rand

	devices  []*invDevice
	again    bool      // the next episode goes silent after its first ping
	lastDrop time.Time // when a device last went without a close frame

	pings  []invPing
	closes []invClose
	notes  []string // what the user did, for a failure report
	// Counts for the summary.
	drops, unexpectedDrops, secondDevices, lapses, leaves int
}

// invPing is a ping and its pong: Redis renewed the session between
// sent and answered, granting ttl. An unanswered ping (zero answered) may
// have renewed it, or not.
type invPing struct {
	sent, answered time.Time
	ttl            time.Duration
}

func (p invPing) confirmed() bool { return !p.answered.IsZero() }

// deadline bounds the deadline the ping granted.
func (p invPing) deadline() (low, high time.Time) {
	if !p.confirmed() {
		return p.sent.Add(faultTTL), p.sent.Add(invPongWait + faultTTL + faultJitter)
	}
	return p.sent.Add(p.ttl), p.answered.Add(p.ttl)
}

// closeEffect is what a normal close did to the session, as far as the
// client can know.
type closeEffect int

const (
	closeEnds      closeEffect = iota // the user's last connection: the session ended
	closeContinues                    // another device is connected: it goes on
	closeUnclear                      // a device connected or dropped just before: either
)

type invClose struct {
	sent, answered time.Time
	effect         closeEffect
}

// invDevice is one connection of a user.
type invDevice struct {
	conn      *chatsim.Conn
	gw        int
	connected time.Time
}

func (u *invUser) note(format string, args ...any) {
	u.notes = append(u.notes, u.run.rel(time.Now())+" "+fmt.Sprintf(format, args...))
}

func (u *invUser) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(u.rng.Int64N(int64(hi-lo)+1))
}

// play runs episodes until the schedule ends, then leaves with 1000.
func (u *invUser) play() {
	pace(u.between(0, 2*time.Second))
	for time.Now().Before(u.run.end) {
		u.episode()
	}
	u.leave()
}

// episode: connect if need be, ping a few times, then one of the ways a
// chat user stops pinging.
func (u *invUser) episode() {
	u.prune()
	if len(u.devices) == 0 && u.connect(u.rng.IntN(2)) == nil {
		pace(200 * time.Millisecond)
		return
	}
	if len(u.devices) == 1 && u.rng.Float64() < 0.2 {
		u.secondDevice()
	}
	u.ping()
	pings := u.rng.IntN(4)
	if u.again {
		pings, u.again = 0, false
	}
	for range pings {
		pace(u.between(1100*time.Millisecond, 1700*time.Millisecond))
		switch x := u.rng.Float64(); {
		case x < 0.08 && len(u.devices) == 2:
			u.drop(u.devices[u.rng.IntN(2)])
		case x < 0.16 && len(u.devices) == 1:
			u.secondDevice()
		}
		u.prune()
		if len(u.devices) == 0 && u.connect(u.rng.IntN(2)) == nil {
			return
		}
		u.ping()
	}
	k := u.lastConfirmed()
	if k < 0 || k != len(u.pings)-1 {
		// The last ping went unanswered: wait out whatever it granted.
		u.note("last ping unanswered: waiting it out")
		pace(invPongWait + faultTTL + faultJitter)
		return
	}
	_, high := u.pings[k].deadline()
	// The first deadline of a minute goes to the consumer at once: a
	// lapse then (back before its guide is out) is what the consumer's
	// session check is for, so it is made likelier. A later one waits for
	// the minute's end, and tests the deferral.
	x := u.rng.Float64()
	failing := u.run.failing()
	if !u.deferrable(k) && (u.rng.Float64() < 0.5 || failing && u.rng.Float64() < 0.8) {
		x = 0.6 // a lapse, below
	}
	switch {
	case x < 0.30:
		u.silence(k, "silent, connected")
	case x < 0.45:
		for len(u.devices) > 0 {
			u.drop(u.devices[0])
		}
		u.silence(k, "silent, network gone")
	case x < 0.60:
		if len(u.devices) == 2 {
			u.close(u.devices[u.rng.IntN(2)])
			u.silence(k, "one device closed with 1000, the other silent")
		} else {
			u.silence(k, "silent, connected")
		}
	case x < 0.85:
		// A lapse: back shortly after the deadline, around when the
		// guide is due. Half leave at once (more while the webhook
		// fails); the others' next episode starts with the comeback,
		// and mostly goes silent again after it.
		u.lapses++
		paceUntil(high.Add(u.between(50*time.Millisecond, 2500*time.Millisecond)))
		leave := 0.5
		if failing {
			leave = 0.7 // back, then gone before the webhook is: the stale case
		}
		u.comeBack(leave)
	default:
		// Leaves while its session is live: no silence.
		paceUntil(u.pings[k].sent.Add(u.between(100*time.Millisecond, 500*time.Millisecond)))
		u.leave()
		pace(u.between(500*time.Millisecond, 3*time.Second))
	}
}

// silence stays silent after ping k until a guide for it arrives, or its
// bound passes, then a moment more. While the webhook fails, a user whose
// guide is due may come back before it arrives, and mostly leave.
func (u *invUser) silence(k int, how string) {
	low, high := u.pings[k].deadline()
	u.note("goes silent (%s), deadline in [%s, %s]", how, u.run.rel(low), u.run.rel(high))
	deferrable := u.deferrable(k)
	due := high
	if deferrable {
		due = later(due, session.DedupWindowEnd(high))
	}
	giveUp := u.run.end.Add(2 * time.Minute)
	var decided bool
	var backAt time.Time
	// Until a guide, the comeback it decided on, or the bound: the
	// condition is checked every poll, and giveUp bounds the wait.
	var then func()
	waitFor(time.Until(giveUp)+time.Second, func() bool {
		for _, g := range u.run.p.hook.Guides(u.uid) {
			if !g.Deadline.Before(low.Add(-invEps)) {
				then = func() {
					u.note("guided")
					pace(u.between(0, 800*time.Millisecond))
				}
				return true
			}
		}
		now := time.Now()
		if !decided && now.After(due.Add(300*time.Millisecond)) && u.run.failing() {
			decided = true
			if u.rng.Float64() < 0.6 {
				backAt = now.Add(u.between(300*time.Millisecond, 2500*time.Millisecond))
			}
		}
		if !backAt.IsZero() && now.After(backAt) {
			then = func() {
				u.lapses++
				u.comeBack(0.7)
			}
			return true
		}
		return now.After(u.run.bound(high, deferrable)) || now.After(giveUp)
	})
	if then == nil {
		u.note("no guide by the bound")
		return
	}
	then()
}

// comeBack ends a silence: with probability leave the user pings and
// leaves with 1000; otherwise its next episode's first ping is the
// comeback, mostly followed by silence again.
func (u *invUser) comeBack(leave float64) {
	u.note("back after the deadline")
	if u.rng.Float64() >= leave {
		u.again = u.rng.Float64() < 0.7
		return
	}
	u.prune()
	if len(u.devices) == 0 && u.connect(u.rng.IntN(2)) == nil {
		return
	}
	u.ping()
	u.leave()
	pace(u.between(500*time.Millisecond, 3*time.Second))
}

// connect opens a connection on gateway instance gw.
func (u *invUser) connect(gw int) *invDevice {
	g := u.run.p.liveGateways()[gw]
	for range 5 {
		c, err := u.sim.Connect(context.Background(), "ws://"+g.gw.PublicAddr().String()+"/v1/ws")
		if err != nil {
			pace(100 * time.Millisecond) // the client's redial backoff
			continue
		}
		dev := &invDevice{conn: c, gw: gw, connected: time.Now()}
		u.devices = append(u.devices, dev)
		u.note("connected to gateway %d", gw)
		return dev
	}
	u.note("could not connect to gateway %d", gw)
	return nil
}

// secondDevice connects on the instance the user is not on yet.
func (u *invUser) secondDevice() {
	if u.connect(1-u.devices[0].gw) != nil {
		u.secondDevices++
	}
}

// prune forgets connections the gateway ended; none should be.
func (u *invUser) prune() {
	kept := u.devices[:0]
	for _, d := range u.devices {
		if d.conn.IsGone() {
			u.unexpectedDrops++
			u.lastDrop = time.Now()
			u.note("connection to gateway %d ended by the gateway", d.gw)
			d.conn.Close()
			continue
		}
		kept = append(kept, d)
	}
	u.devices = kept
}

func (u *invUser) forget(d *invDevice) {
	for i, x := range u.devices {
		if x == d {
			u.devices = append(u.devices[:i], u.devices[i+1:]...)
			return
		}
	}
}

// ping pings on one of the user's connections and waits for the pong.
func (u *invUser) ping() {
	// A connection renews at most once a second and answers faster pings
	// from its last grant; spacing every ping of the user keeps each a
	// renewal, so that the last one sets the deadline.
	if n := len(u.pings); n > 0 {
		paceUntil(u.pings[n-1].sent.Add(invPingSpacing))
	}
	d := u.devices[u.rng.IntN(len(u.devices))]
	// A pong that comes after its ping was given up answers that ping,
	// not this one: the connection keeps its pings in line.
	p := invPing{sent: time.Now()}
	if a, err := d.conn.PingWait(invPongWait); err == nil && a.TTL > 0 {
		p = invPing{sent: a.Sent, answered: a.At, ttl: a.TTL}
	}
	u.pings = append(u.pings, p)
	if p.confirmed() {
		u.note("ping on gateway %d: granted %v", d.gw, p.ttl)
	} else {
		u.note("ping on gateway %d: no pong", d.gw)
	}
}

// lastConfirmed is the index of the last answered ping, or -1.
func (u *invUser) lastConfirmed() int {
	for k := len(u.pings) - 1; k >= 0; k-- {
		if u.pings[k].confirmed() {
			return k
		}
	}
	return -1
}

// drop loses a connection as a network does: no close frame.
func (u *invUser) drop(d *invDevice) {
	d.conn.Close()
	u.forget(d)
	u.lastDrop = time.Now()
	u.drops++
	u.note("connection to gateway %d dropped", d.gw)
}

// close closes a connection with 1000 and waits for the answer. What it
// does to the session depends on the user's other connections: their
// route writes land a moment after they connect or drop.
func (u *invUser) close(d *invDevice) {
	now := time.Now()
	c := invClose{sent: now, effect: closeEnds}
	for _, o := range u.devices {
		if o == d {
			continue
		}
		c.effect = closeContinues
		if now.Sub(o.connected) < invEndLag {
			c.effect = closeUnclear
			break
		}
	}
	if now.Sub(u.lastDrop) < invEndLag {
		c.effect = closeUnclear
	}
	if err := d.conn.Leave(3 * time.Second); errors.Is(err, chatsim.ErrNoAnswer) {
		c.effect = closeUnclear
	}
	c.answered = time.Now()
	u.forget(d)
	u.closes = append(u.closes, c)
	u.note("closed gateway %d's connection with 1000 (%s)", d.gw, [...]string{"ends", "continues", "unclear"}[c.effect])
}

// leave closes every connection with 1000.
func (u *invUser) leave() {
	u.prune()
	if len(u.devices) > 0 {
		u.leaves++
	}
	for len(u.devices) > 0 {
		u.close(u.devices[len(u.devices)-1])
	}
}

func TestAlignEnd(t *testing.T) {
	at := func(min, sec int) time.Time { return time.Date(2026, 1, 1, 10, min, sec, 0, time.UTC) }
	for _, tt := range []struct {
		name       string
		start, end time.Time
		want       time.Time
	}{
		{"in the second half already", at(0, 10), at(0, 55), at(1, 30)},
		{"ends early in a minute", at(0, 20), at(1, 5), at(1, 30)},
		{"ends within seconds 30 to 45", at(0, 0), at(0, 40), at(1, 40)},
		{"a turn 8s in counts", at(0, 52), at(1, 37), at(1, 37)},
		// Started at :59: the only turn came a second in, before any
		// disruption; a minute more brings one.
		{"started at the end of a minute", at(0, 59), at(1, 44), at(2, 44)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := alignEnd(tt.start, tt.end)
			if !got.Equal(tt.want) {
				t.Fatalf("alignEnd(%s, %s) = %s, want %s", tt.start.Format("04:05"), tt.end.Format("04:05"), got.Format("04:05"), tt.want.Format("04:05"))
			}
			if s := got.Second(); s < 30 || s > 45 {
				t.Fatalf("ends at second %d, want 30 to 45", s)
			}
			if turn := got.Truncate(time.Minute); turn.Before(tt.start.Add(8 * time.Second)) {
				t.Fatalf("the last turn %s comes less than 8s after the start", turn.Format("04:05"))
			}
		})
	}
}
