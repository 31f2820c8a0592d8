// Command bench is the benchmark behind make bench. It builds nothing: it
// expects the gateway, wsload, guidebench and (when present) detectbench
// and outagebench binaries in -bin, starts a child redis-server, runs each
// step against processes of their own, and writes report.md and
// report.json to -out:
//
//  1. connections: several gateway processes on one redis-server, held by
//     several wsload processes at 15 s pings; sessions held, RSS and CPU
//     per gateway, a heap profile of one, and guides pushed through one
//     gateway to users on another (push routing); 1b. held: the same at
//     250,000 connections, pinging every 60 s;
//  2. renewals: Redis round trips per renewal at a renewal rate, with the
//     gateway's and redis-server's CPU;
//  3. and 4. detection and storm, from detectbench; 3b. detection at a
//     million live sessions with one and two listener replicas, the
//     prefetch path against the sweep alone, from detectbench;
//  5. consumer throughput and backlog drain, from guidebench;
//     5b. activity events applied per second through the topic, on one
//     redis-server and on a Redis Cluster of two masters, and the
//     guide lateness of users kept alive only through the topic beside
//     users kept alive by WebSocket pings (and the latter with the feed
//     off), from activitybench;
//  6. outage: users guided or not through outages of Redis and of the
//     gateways, from outagebench;
//  7. modes: a gateway in each read mode (epoll, goroutine) side by side
//     under the same load: memory per connection idle and pinging, CPU
//     per ping, ping→pong time, renewals per Redis round trip.
//
// Every figure in the report comes with the command that reproduces it.
// It exits 1 when a guide was lost or doubled (events mode excepted: its
// losses are what the sweep is for), a user who was there was guided
// through an outage, a step failed, or the report could not be written;
// never on a timing figure. Every child runs in a process
// group of its own that is ended on exit, on SIGINT or SIGTERM, and (by
// the parent-death signal) if bench itself dies.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	bin := flag.String("bin", "bin", "directory with the gateway, wsload, guidebench, detectbench and outagebench binaries")
	out := flag.String("out", "bench", "directory for report.md and report.json")
	quick := flag.Bool("quick", false, "every step at small scale (about 6 minutes), for CI")
	steps := flag.String("steps", strings.Join(allSteps, ","), "comma-separated steps to run")
	var over connOverride
	flag.IntVar(&over.conns, "conns", 0, "step 1: connections to hold (0: the step's scale)")
	flag.IntVar(&over.gateways, "gateways", 0, "step 1: gateway processes (0: the step's scale); each holds conns/gateways, under the open-file limit")
	flag.IntVar(&over.loaders, "wsloads", 0, "step 1: wsload processes (0: the step's scale)")
	flag.DurationVar(&over.every, "ping-every", 0, "step 1: each connection's ping interval (0: the step's scale)")
	flag.IntVar(&over.ramp, "ramp", 0, "step 1: new connections per second, all wsloads together (0: the step's scale)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	failed, err := run(ctx, *bin, *out, *quick, *steps, over)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if failed {
		fmt.Fprintln(os.Stderr, "bench: a step failed, a guide was lost or doubled, or a user who was there was guided; see the report")
		os.Exit(1)
	}
}

// connOverride sets step 1's scale from flags; zero fields keep it.
type connOverride struct {
	conns, gateways, loaders, ramp int
	every                          time.Duration
}

// apply sets sc's fields from o, and returns the flags that say so, for
// the step's command.
func (o connOverride) apply(sc *connScale) (flags string) {
	set := func(name string, v int, field *int) {
		if v > 0 {
			*field = v
			flags += fmt.Sprintf(" -%s %d", name, v)
		}
	}
	set("conns", o.conns, &sc.Conns)
	set("gateways", o.gateways, &sc.Gateways)
	set("wsloads", o.loaders, &sc.Loaders)
	set("ramp", o.ramp, &sc.Ramp)
	if o.every > 0 {
		sc.Every = o.every
		// Every connection pings once before the window.
		sc.Settle = o.every + time.Second
		flags += " -ping-every " + o.every.String()
	}
	return flags
}

var allSteps = []string{"connections", "held", "renewals", "modes", "detection", "consumer", "activity", "outage"}

// scale is the size of every step.
type scale struct {
	conns    connScale
	held     connScale // step 1b
	renew    renewScale
	detect   detectScale
	scale    detectScale // step 3b: detection at scale, by replicas
	consumer consumerScale
	activity activityScale
	outage   outageScale
	modes    modesScale
}

func scaleFor(quick bool) scale {
	if quick {
		return scale{
			conns: connScale{Gateways: 2, Conns: 4000, Loaders: 2, Ramp: 2000,
				Settle: 5 * time.Second, Window: 10 * time.Second, Pushes: 100, IPsPerGen: 1, Leave: 2 * time.Second, ReadMode: "epoll", Every: 15 * time.Second,
				Step: "1", Tag: "c", NetByte: 10},
			// Step 1b's path at a tenth of a minute: pings every 10 s,
			// under a 40 s TTL and a 20 s idle timeout.
			held: connScale{Gateways: 2, Conns: 2000, Loaders: 2, Ramp: 2000,
				Settle: 11 * time.Second, Window: 5 * time.Second, Pushes: 50, IPsPerGen: 1, Leave: 2 * time.Second, ReadMode: "epoll",
				Every: 10 * time.Second, TTL: 40 * time.Second, Idle: 20 * time.Second, Step: "1b", Tag: "h", NetByte: 11},
			modes: modesScale{Conns: 1000, Every: 2 * time.Second, Ramp: 1000, Idle: 4 * time.Second, Window: 6 * time.Second, Leave: time.Second},
			renew: renewScale{Conns: 2000, Loaders: 1, Every: 2 * time.Second, Window: 8 * time.Second},
			detect: detectScale{Live: 5000, Silent: 200, Storm: 2000, Window: 3 * time.Second, Wait: 15 * time.Second,
				Grace: 10 * time.Second, Limit: 100 * time.Second},
			scale: detectScale{Live: 20000, Silent: 200, Window: 3 * time.Second, Wait: 15 * time.Second,
				Grace: 10 * time.Second, Limit: 3 * time.Minute},
			consumer: consumerScale{Events: 2000, Queued: 1000, BreakerTimeout: 2 * time.Second, Limit: time.Minute},
			activity: activityScale{Events: 20000, Users: 5000, Silent: 100, Active: 50, Spread: 3 * time.Second, Limit: 2 * time.Minute},
			// Two faults keep the quick run near 3 minutes: one in which
			// the listener is as blind as the gateways (Redis frozen), one
			// in which it sweeps on while every user is cut off and
			// reconnecting.
			outage: outageScale{Active: 200, Silent: 50, TTL: 6 * time.Second, Jitter: 500 * time.Millisecond,
				Grace: 8 * time.Second, Faults: "redis-pause,gateways-down", Limit: 3 * time.Minute},
		}
	}
	return scale{
		// 100,000 connections pinging every 15 s, the RSS goal's
		// conditions: six gateways of 16,667 each stay inside the 20k
		// open-file limit, six wsloads over two source addresses apiece,
		// each process on one P (Procs). Settle: every connection has
		// pinged once.
		conns: connScale{Gateways: 6, Conns: 100000, Loaders: 6, Ramp: 1000,
			Settle: 16 * time.Second, Window: 30 * time.Second, Pushes: 1000, IPsPerGen: 2, Leave: 20 * time.Second,
			ReadMode: "epoll", Every: 15 * time.Second, Procs: 1, Step: "1", Tag: "c", NetByte: 10},
		// 250,000 connections, the held goal: 14 gateways of 17,858 and
		// as many wsloads, pinging every 60 s under a 4 min TTL and a
		// 2 min idle timeout (a cadence a deployment of this many
		// connections per core would choose; why not 15 s: see heldMD).
		held: connScale{Gateways: 14, Conns: 250000, Loaders: 14, Ramp: 1000,
			Settle: 61 * time.Second, Window: 30 * time.Second, Pushes: 1000, IPsPerGen: 2, Leave: 30 * time.Second,
			ReadMode: "epoll", Every: time.Minute, TTL: 4 * time.Minute, Idle: 2 * time.Minute, Procs: 1, Step: "1b", Tag: "h", NetByte: 11},
		modes:  modesScale{Conns: 15000, Every: 15 * time.Second, Ramp: 3000, Idle: 12 * time.Second, Window: 30 * time.Second, Leave: 5 * time.Second},
		renew:  renewScale{Conns: 10000, Loaders: 2, Every: 2 * time.Second, Window: 20 * time.Second},
		detect: detectScale{Live: 100000, Silent: 1000, Storm: 50000, Grace: 10 * time.Second, Limit: 20 * time.Minute},
		// The scale: a million live sessions, one and two replicas.
		scale:    detectScale{Live: 1000000, Silent: 1000, Grace: 10 * time.Second, Limit: 10 * time.Minute},
		consumer: consumerScale{Events: 20000, Queued: 10000, BreakerTimeout: 10 * time.Second, Limit: 15 * time.Minute},
		// Lateness: a few thousand users, two runs of about 30 s.
		activity: activityScale{Events: 200000, Users: 50000, Silent: 1000, Active: 500, Spread: 10 * time.Second, Limit: 5 * time.Minute},
		outage: outageScale{Active: 1000, Silent: 200, TTL: 6 * time.Second, Jitter: 500 * time.Millisecond,
			Grace: 8 * time.Second, Faults: "redis-pause,redis-restart,redis-cut,gateways-down", Limit: 5 * time.Minute},
	}
}
