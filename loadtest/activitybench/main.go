// Command activitybench measures the activity feed on this machine, in two
// parts, one after the other:
//
//  1. Throughput: the events per second one gateway applies from the
//     activity topic, its consumer group's only member. It starts its own
//     redis-server and embedded Kafka, produces the events first (`active`
//     events of distinct users, keyed by uid), then starts one gateway with
//     the feed, and times it from its start until the feed's watermark, in
//     Redis, has passed the last event: every event is then applied, as
//     the listener sees it. It fails unless every user has a session after.
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
	"syscall"
	"time"
)

// Report is what activitybench prints.
type Report struct {
	Events          int     `json:"events"`
	Users           int     `json:"users"`
	Partitions      int     `json:"partitions"`
	EventsPerSecond float64 `json:"events_per_second"` // one gateway, from its start to the watermark past the last event
	Seconds         float64 `json:"seconds"`
	Sessions        int64   `json:"sessions"` // live sessions after: one per user, none lost
	// Redis is what Redis did per event in the throughput part, and
	// ProcessCPUMicros the CPU this process used per event meanwhile: the
	// gateway's, with the in-process Kafka's.
	Redis            *RedisCost `json:"redis_per_event,omitempty"`
	ProcessCPUMicros float64    `json:"process_cpu_micros_per_event,omitempty"`
	CPUs             int        `json:"cpus"`
	Go               string     `json:"go"`
	// Lateness is part 2; nil with -late-silent 0.
	Lateness *Lateness `json:"lateness,omitempty"`
}

func main() {
	events := flag.Int("events", 200000, "activity events on the topic")
	users := flag.Int("users", 50000, "distinct users they are spread over")
	partitions := flag.Int("partitions", 12, "partitions of the activity topic")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
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
	rep, err := run(ctx, *events, *users, *partitions, late)
	if err != nil {
		fmt.Fprintln(os.Stderr, "activitybench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
}

func run(ctx context.Context, events, users, partitions int, late lateSettings) (Report, error) {
	rep := Report{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if late.silent < 0 || late.active < 0 || late.ttl < time.Second || late.spread <= 0 {
		return rep, fmt.Errorf("want -late-silent, -late-active >= 0, -late-ttl >= 1s, -late-spread > 0")
	}
	if err := throughput(ctx, &rep, events, users, partitions); err != nil {
		return rep, err
	}
	if late.silent == 0 {
		return rep, nil
	}
	fmt.Fprintf(os.Stderr, "activitybench: %d events/s; lateness: %d silent and %d active users per feed, TTL %v, stamp %v\n",
		int(rep.EventsPerSecond), late.silent, late.active, late.ttl, late.stamp)
	var err error
	rep.Lateness, err = lateness(ctx, late)
	return rep, err
}
