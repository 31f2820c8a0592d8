// Command activitybench measures the activity feed on this machine, in two
// parts, one after the other:
//
//  1. Throughput: the events per second one gateway applies from the
//     activity topic, its consumer group's only member. It starts its own
//     Redis and embedded Kafka, produces the events first (`active`
//     events of distinct users, keyed by uid), then starts one gateway with
//     the feed, and times it from its start until the feed's watermark, in
//     Redis, has passed the last event: every event is then applied, as
//     the listener sees it. It fails unless every user has a session after.
//     It runs once for each Redis of -redis-masters: one redis-server,
//     whose one thread bounds the feed (each event is a script of several
//     commands), and a Redis Cluster of two masters, which a deployment
//     runs for more: the gateway is the same, and spreads each batch's
//     scripts over the masters.
//  2. Lateness (lateness.go): the dev stack with the feed on and guides to
//     a webhook, and two crowds beside each other: users kept alive only by
//     `active` events on the topic, and users kept alive by WebSocket
//     pings. Of each, -late-silent go silent at known times and
//     -late-active stay active; it reports each crowd's guide lateness
//     past the deadline the guide names (p50, p99, max) and their ratio,
//     and counts guides lost, doubled, or to users who were there. Then
//     (-late-baseline) the WebSocket users again, alone in a stack with
//     the feed off: what the feed's watermark adds to every guide.
//     -late-silent 0 leaves the lateness part out.
//
// It prints its figures as one JSON object on stdout and exits 1 only when
// it could not measure: judging the counts is the caller's.
//
//	go run ./loadtest/activitybench -events 200000 -users 50000 -late-silent 1000 -late-active 500
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Report is what activitybench prints.
type Report struct {
	Events     int `json:"events"`
	Users      int `json:"users"`
	Partitions int `json:"partitions"`
	// Throughput is part 1, one run for each Redis of -redis-masters.
	Throughput []Throughput `json:"throughput"`
	CPUs       int          `json:"cpus"`
	Go         string       `json:"go"`
	// Lateness is part 2; nil with -late-silent 0.
	Lateness *Lateness `json:"lateness,omitempty"`
}

func main() {
	events := flag.Int("events", 200000, "activity events on the topic")
	users := flag.Int("users", 50000, "distinct users they are spread over")
	partitions := flag.Int("partitions", 12, "partitions of the activity topic")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	masters := flag.String("redis-masters", "1,2", "throughput: the Redis of each run, by its masters: 1 is one redis-server, more a Redis Cluster of that many")
	flag.IntVar(&maxBatch, "max-batch", 0, "throughput: STILLTHERE_ACTIVITY_MAX_BATCH, the most records the feed applies at once (0: the gateway's default)")
	var late lateSettings
	flag.IntVar(&late.silent, "late-silent", 1000, "lateness: users of each feed (topic, WebSocket) who go silent; 0 skips the lateness part")
	flag.IntVar(&late.active, "late-active", 500, "lateness: users of each feed who stay active throughout")
	flag.DurationVar(&late.ttl, "late-ttl", 5*time.Second, "lateness: the session TTL; users act every quarter of it")
	flag.DurationVar(&late.spread, "late-spread", 10*time.Second, "lateness: the silences begin spread over this")
	flag.BoolVar(&late.baseline, "late-baseline", true, "lateness: run the WebSocket users again, alone, with the feed off, for the lateness the feed adds")
	flag.DurationVar(&late.stamp, "late-stamp", 250*time.Millisecond, "lateness: STILLTHERE_ACTIVITY_STAMP, how often the feed stamps its watermark")
	flag.Parse()
	late.partitions = *partitions
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "activitybench:", err)
			os.Exit(1)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "activitybench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var runs []int
	for _, f := range strings.Split(*masters, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 16 {
			fmt.Fprintf(os.Stderr, "activitybench: -redis-masters: %q, want counts between 1 and 16, separated by commas\n", *masters)
			os.Exit(2)
		}
		runs = append(runs, n)
	}
	rep, err := run(ctx, *events, *users, *partitions, runs, late)
	if err != nil {
		fmt.Fprintln(os.Stderr, "activitybench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
}

func run(ctx context.Context, events, users, partitions int, masters []int, late lateSettings) (Report, error) {
	rep := Report{Events: events, Users: users, Partitions: partitions, CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if late.silent < 0 || late.active < 0 || late.ttl < time.Second || late.spread <= 0 {
		return rep, fmt.Errorf("want -late-silent, -late-active >= 0, -late-ttl >= 1s, -late-spread > 0")
	}
	for _, m := range masters {
		t, err := throughput(ctx, events, users, partitions, m)
		if err != nil {
			return rep, fmt.Errorf("throughput, %d Redis masters: %w", m, err)
		}
		fmt.Fprintf(os.Stderr, "activitybench: %d Redis masters: %.0f events/s; Redis %.1f µs per event, its masters' cores %v; this process %.1f µs per event\n",
			m, t.EventsPerSecond, t.Redis.CPUMicros, t.RedisCores, t.ProcessCPUMicros)
		rep.Throughput = append(rep.Throughput, t)
	}
	if late.silent == 0 {
		return rep, nil
	}
	fmt.Fprintf(os.Stderr, "activitybench: lateness: %d silent and %d active users per feed, TTL %v, stamp %v\n",
		late.silent, late.active, late.ttl, late.stamp)
	var err error
	rep.Lateness, err = lateness(ctx, late)
	return rep, err
}
