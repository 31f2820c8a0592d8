// Command nemesis is stillthere's fault-schedule suite: the real stack
// (three gateways, two expiry listeners and two guide consumers as child
// processes from bin/, a Redis Cluster of three masters with a replica
// each, kfake in this process) with users on WebSockets (some with two
// devices) and on the activity API (turns to them and to us), a close
// stage after the reminder, and faults composed at random from a seed:
// SIGSTOP and SIGKILL of each service, TCP cuts at the proxies in front
// of the gateways, Redis pauses, failovers (graceful and hard), a
// restart without data and a reshard, Kafka refusing produce or fetch, a
// CPU hog, duplicated and reordered pushes, and a third of the users
// falling silent at once (which the mass-expiry brake holds).
//
// It records the history (every signal with its outcome, every guide a
// device saw, every fault window), hands it to package promise, and
// writes a table per fault kind in Jepsen's form, the schedule, and the
// paths the run reached (holds, the brake, spool replays, stale marks,
// deferred minutes, rebalances, resyncs) to -out. It exits 1 on any
// lost, false, duplicated, disordered or spam stage, or a path never
// reached; 2 when it could not run. The seed is printed first: -seed
// replays the schedule (the machine's timing is not replayed).
//
//	make nemesis                      # DURATION=3m SEED=1
//	make nemesis DURATION=1h SEED=random
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// settings are the run's flags.
type settings struct {
	bin        string
	out        string
	seed       uint64
	duration   time.Duration
	users      int
	ttl        time.Duration
	closeAfter time.Duration
	grace      time.Duration
	kinds      []kind
	keepLogs   bool
	coverage   bool // fail on a path never reached
}

func main() {
	var s settings
	seed := flag.String("seed", "1", `the schedule's seed, or "random"`)
	kindList := flag.String("faults", "", "fault kinds to compose, comma-separated; empty: every kind")
	flag.StringVar(&s.bin, "bin", "bin", "directory of the gateway, expiry-listener and guide-consumer binaries")
	flag.StringVar(&s.out, "out", "bench/nemesis.md", "the report")
	flag.DurationVar(&s.duration, "duration", 3*time.Minute, "how long faults are composed")
	flag.IntVar(&s.users, "users", 60, "users: 3 in 5 on WebSockets (a third of those with two devices), the rest on the activity API")
	flag.DurationVar(&s.ttl, "ttl", defaultTTL, "the gateways' session TTL")
	flag.DurationVar(&s.closeAfter, "close-after", 3*time.Second, "the close stage's delay after the reminder")
	flag.DurationVar(&s.grace, "grace", 0, "the listeners' outage grace, at least the TTL and the devices' reconnect time; 0: that minimum")
	flag.BoolVar(&s.keepLogs, "keep-logs", false, "keep the services' logs (their directory is printed)")
	dump := flag.String("dump", "", "write the history and verdicts, as JSON lines by user, to this file (on a failure, by default to the temporary directory)")
	flag.BoolVar(&s.coverage, "coverage", true, "fail when a path the run was meant to reach never ran")
	flag.Parse()
	var err error
	if s.seed, err = parseSeed(*seed); err != nil {
		fmt.Fprintln(os.Stderr, "nemesis:", err)
		os.Exit(2)
	}
	if s.kinds, err = kindsNamed(*kindList); err != nil {
		fmt.Fprintln(os.Stderr, "nemesis:", err)
		os.Exit(2)
	}
	if err := s.fill(); err != nil {
		fmt.Fprintln(os.Stderr, "nemesis:", err)
		os.Exit(2)
	}
	fmt.Printf("nemesis: seed %d, duration %v (replay: make nemesis SEED=%d DURATION=%v)\n", s.seed, s.duration, s.seed, s.duration)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, s)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nemesis:", err)
		os.Exit(2)
	}
	if *dump == "" && res.failed(s.coverage) {
		*dump = fmt.Sprintf("%s/nemesis-%d-history.jsonl", os.TempDir(), s.seed)
	}
	if *dump != "" {
		if err := res.dump(*dump); err != nil {
			fmt.Fprintln(os.Stderr, "nemesis:", err)
		} else {
			fmt.Fprintf(os.Stderr, "nemesis: the history and verdicts, by user, are in %s\n", *dump)
		}
	}
	md := res.markdown()
	if err := os.WriteFile(s.out, []byte(md), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "nemesis:", err)
		os.Exit(2)
	}
	fmt.Print(md)
	if res.failed(s.coverage) {
		fmt.Printf("nemesis: FAILED (seed %d)\n", s.seed)
		os.Exit(1)
	}
	fmt.Printf("nemesis: passed (seed %d)\n", s.seed)
}

// defaultTTL is the run's session TTL unless -ttl says otherwise.
const defaultTTL = 4 * time.Second

// fill gives the listeners' outage grace its minimum when none was asked
// for, and refuses one below it: a run whose listeners release a stopped
// gateway's users before they could have reconnected sends guides to
// users who were there, and the checker rightly calls them spam.
func (s *settings) fill() error {
	if s.grace == 0 {
		s.grace = outageGrace(s.ttl)
	}
	if least := outageGrace(s.ttl); s.grace < least {
		return fmt.Errorf("-grace %v: below the outage grace's minimum for a TTL of %v, %v (the TTL and the devices' reconnect time)", s.grace, s.ttl, least)
	}
	return nil
}

// outageGrace is the least outage grace the operations guide allows for
// the run's listeners: the longest TTL plus its jitter (none here), plus
// the time clients take to reconnect. A user on a gateway that stopped
// (SIGSTOP: its kernel still takes connections, nothing answers) is held
// until the gateway's last heartbeat and the grace, and must have pinged
// another gateway by then:
//
//   - within the TTL, a device that is there pings (every ttl/3, give or
//     take a fifth) and, when its gateway does not answer within
//     answerWait, leaves it (the documented TTL term is the client's ping
//     period and pong timeout; the run's answerWait is fixed, so a short
//     TTL gets the sum instead);
//   - then it reconnects: its next try may hang as well (the user's
//     other device still on the stopped gateway, or a dial that lands on
//     it, or on one cut: a handshake's timeout), and after a failed dial
//     a device pauses, redialMin doubling up to redialMax, before the next.
//     One such try and the longest pause bound the reconnect.
func outageGrace(ttl time.Duration) time.Duration {
	pingGap := ttl / 3 * 6 / 5 // the longest pause between a present user's signals
	return max(ttl, pingGap+answerWait) + reconnectTime
}

// reconnectTime is the devices' reconnect time after they left a gateway
// that answered nothing: one more try that hangs, and the longest pause
// after a failed dial (the pauses start at redialMin and double up to
// redialMax).
const reconnectTime = max(handshakeTimeout, answerWait) + redialMax

// parseSeed reads a seed, or draws one for "random".
func parseSeed(v string) (uint64, error) {
	if v == "random" || v == "" {
		return rand.Uint64() % 1_000_000, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("-seed %q: want a number or random", v)
	}
	return n, nil
}
