// Command outagebench measures that a silence we caused is not taken for
// the user's: through outages of Redis and of the gateways, users who
// were there get no guide, and users who did fall silent get theirs once,
// a grace late at most.
//
// It runs the pipeline on loopback: a child redis-server with its
// append-only file (fsync always), gateway processes (the binary -gateway
// names) that reach it through a TCP proxy, embedded Kafka, and in this
// process the expiry listener, a guide consumer with the webhook sender,
// and the webhook, which counts guides per user. Chat users connect over
// WebSockets and reconnect on their own whenever dropped: -active users
// ping every TTL/4 throughout; for each fault -silent more stop pinging
// at times spread so that their deadlines fall before, in, and up to a
// few seconds past the grace after the fault (they keep their
// connections, as an app left open does).
//
// The faults, one after another, each for -outage (2 TTL by default):
//
//	redis-pause     redis-server stopped (SIGSTOP), then resumed
//	redis-restart   redis-server killed, then restarted from its AOF
//	redis-cut       the gateways' path to Redis cut at the proxy, then restored
//	gateways-down   every gateway killed (SIGKILL), then started again
//
// Per fault it reports the active users guided (the goal is none), the
// silent users guided exactly once, lost, doubled or guided before the
// deadline their last answered ping earned, and the extra delay of those
// whose deadline fell in the fault or the grace after it. No silence is
// called lost before the grace and 5 s more have passed since its latest
// possible deadline. What the mechanism did (holds by rule, blind
// intervals recorded, the services' log lines) comes with each fault.
//
// It prints one JSON object on stdout and exits 1 only when it could not
// measure: judging the figures is the caller's. Its children (the
// gateways, redis-server) get SIGKILL if it dies.
//
//	go build -o bin/ ./gateway ./loadtest/outagebench && bin/outagebench -gateway bin/gateway
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/stillthere/stillthere/pkg/token"
)

// settings are the run's flags.
type settings struct {
	gatewayBin     string
	gateways       int
	active, silent int
	ttl, jitter    time.Duration
	grace, outage  time.Duration
	faults         []fault
}

// settle is how much longer than the grace the bench waits for a guide
// past the latest deadline it may be for: the recheck, produce and send.
const settle = 5 * time.Second

func main() {
	var s settings
	flag.StringVar(&s.gatewayBin, "gateway", "bin/gateway", "the gateway binary")
	flag.IntVar(&s.gateways, "gateways", 2, "gateway processes")
	flag.IntVar(&s.active, "active", 1000, "users pinging throughout")
	flag.IntVar(&s.silent, "silent", 200, "users falling silent around each fault")
	flag.DurationVar(&s.ttl, "ttl", 6*time.Second, "the gateways' session TTL; users ping every TTL/4")
	flag.DurationVar(&s.jitter, "jitter", 500*time.Millisecond, "the gateways' session jitter")
	flag.DurationVar(&s.grace, "grace", 8*time.Second, "the listener's outage grace")
	flag.DurationVar(&s.outage, "outage", 0, "how long each fault lasts; 0 means 2 TTL")
	faults := flag.String("faults", "redis-pause,redis-restart,redis-cut,gateways-down", "faults to cause, in order")
	flag.Parse()
	var err error
	if s.faults, err = faultsNamed(*faults); err != nil {
		fmt.Fprintln(os.Stderr, "outagebench:", err)
		os.Exit(2)
	}
	if s.outage == 0 {
		s.outage = 2 * s.ttl
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep := Report{Command: "outagebench " + strings.Join(os.Args[1:], " ")}
	if err := run(ctx, s, &rep); err != nil {
		fmt.Fprintln(os.Stderr, "outagebench:", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
}

func run(ctx context.Context, s settings, rep *Report) error {
	period := s.ttl / 4
	*rep = Report{Command: rep.Command, Gateways: s.gateways, Active: s.active, Silent: s.silent,
		TTLMS: ms(s.ttl), JitterMS: ms(s.jitter), PingEveryMS: ms(period), GraceMS: ms(s.grace), OutageMS: ms(s.outage)}
	logs := newTally(os.Stderr)
	r, err := startRig(ctx, s, logs)
	if err != nil {
		return err
	}
	defer r.close()

	c := &crowd{urls: r.gws.urls(), ttl: s.ttl, jitter: s.jitter, period: period}
	add := func(name string, set int) error {
		tok, err := token.Mint([]byte(r.token), name, "", 24*time.Hour)
		if err != nil {
			return err
		}
		c.users = append(c.users, c.newUser(name, tok, set))
		return nil
	}
	for i := range s.active {
		if err := add(fmt.Sprintf("active-%05d", i), -1); err != nil {
			return err
		}
	}
	phases := make([]*phase, len(s.faults))
	for k, f := range s.faults {
		phases[k] = &phase{f: f}
		for i := range s.silent {
			if err := add(fmt.Sprintf("silent-%s-%04d", f.name, i), k); err != nil {
				return err
			}
			phases[k].set = append(phases[k].set, c.users[len(c.users)-1])
		}
	}
	uctx, stopUsers := context.WithCancel(ctx)
	defer func() { stopUsers(); c.wait() }()
	const ramp = 1000 // connections per second
	c.start(uctx, ramp)
	up := time.Duration(len(c.users))*time.Second/ramp + 10*time.Second
	for end := time.Now().Add(up); c.pinged() < len(c.users); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) || ctx.Err() != nil {
			return fmt.Errorf("only %d of %d users connected and pinged within %v", c.pinged(), len(c.users), up)
		}
	}
	fmt.Fprintf(os.Stderr, "outagebench: %d users up (%d active, %d silent per fault), TTL %v, grace %v, each fault %v\n",
		len(c.users), s.active, s.silent, s.ttl, s.grace, s.outage)

	if err := runFaults(ctx, s, r, c, phases); err != nil {
		return err
	}
	stopUsers()
	c.wait()
	judge(phases, c.users, r.hook, s.grace, s.active)
	blind := r.blindIntervals(ctx)
	for _, p := range phases {
		p.res.Blind = p.blindFor(blind)
		p.res.Logs = logs.between(p.start, p.end)
		rep.Faults = append(rep.Faults, p.res)
	}
	rep.Posts, rep.Distinct = r.hook.counts()
	return ctx.Err()
}

// runFaults causes each fault in turn and waits, after the last, until
// every guide is due.
//
// Fault k's silent users stop pinging at times spread over the fault, the
// grace after it and a few seconds around, so that their deadlines fall
// from about 3 s before the fault to 2 s past the grace after it. The
// next fault starts once the previous one's grace has passed and its own
// earliest deadlines are past that too, so no fault's holds reach another
// fault's silences.
func runFaults(ctx context.Context, s settings, r *rig, c *crowd, phases []*phase) error {
	next := time.Now().Add(s.ttl + 3*time.Second)
	span := s.outage + s.grace + 4*time.Second
	for _, p := range phases {
		first := next.Add(-s.ttl - 2*time.Second)
		for i, u := range p.set {
			u.silenceAt.Store(first.Add(span * time.Duration(i) / time.Duration(len(p.set))).UnixNano())
		}
		if !sleepCtx(ctx, time.Until(next)) {
			return ctx.Err()
		}
		p.held, p.dials = held(), dials(c)
		if err := p.f.inject(ctx, r); err != nil {
			return fmt.Errorf("%s: %w", p.f.name, err)
		}
		p.start = time.Now()
		fmt.Fprintf(os.Stderr, "outagebench: %s: %s\n", p.f.name, p.f.what)
		if !sleepCtx(ctx, time.Until(p.start.Add(s.outage))) {
			return ctx.Err()
		}
		if err := p.f.recover(ctx, r); err != nil {
			return fmt.Errorf("%s: recover: %w", p.f.name, err)
		}
		p.recovered = time.Now()
		p.res.Fault, p.res.What, p.res.DownMS = p.f.name, p.f.what, ms(p.recovered.Sub(p.start))
		fmt.Fprintf(os.Stderr, "outagebench: %s: recovered after %v\n", p.f.name, p.recovered.Sub(p.start).Round(time.Millisecond))
		next = later(p.recovered.Add(s.grace+4500*time.Millisecond), time.Now().Add(s.ttl+3*time.Second))
	}
	// Every silent user's guide may be held for the grace past the latest
	// deadline it may have; users guided by mistake would be by then too.
	// The latest deadlines grow until the last silences begin, so look
	// again after each wait.
	for {
		end := phases[len(phases)-1].recovered.Add(s.grace + settle)
		for _, p := range phases {
			for _, u := range p.set {
				_, high := u.Deadlines()
				high = later(high, time.Unix(0, u.silenceAt.Load()).Add(s.ttl+s.jitter))
				end = later(end, high.Add(s.grace+settle))
			}
		}
		if !time.Now().Before(end) {
			break
		}
		if !sleepCtx(ctx, time.Until(end)) {
			return ctx.Err()
		}
	}
	now := time.Now()
	for i, p := range phases {
		p.end = now
		if i+1 < len(phases) {
			p.end = phases[i+1].start
		}
		p.res.Held = since(held(), p.held)
		if i+1 < len(phases) {
			p.res.Held = since(phases[i+1].held, p.held)
		}
		p.res.Dials = dials(c) - p.dials
		if i+1 < len(phases) {
			p.res.Dials = phases[i+1].dials - p.dials
		}
	}
	return nil
}

// dials is every user's connects so far, failed ones included.
func dials(c *crowd) int {
	n := 0
	for _, u := range c.users {
		n += u.Record().Dials
	}
	return n
}
