// Command activitybench measures the activity feed on this machine: the
// events per second one gateway applies from the activity topic, its
// consumer group's only member. It starts its own redis-server and
// embedded Kafka, produces the events first (`active` events of distinct
// users, keyed by uid), then starts one gateway with the feed, and times
// it from its start until the feed's watermark, in Redis, has passed the
// last event: every event is then applied, as the listener sees it. It
// prints its figures as one JSON object on stdout.
//
//	go run ./loadtest/activitybench -events 200000 -users 50000
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/activityfeed"
	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/session"
)

// Report is what activitybench prints.
type Report struct {
	Events          int     `json:"events"`
	Users           int     `json:"users"`
	Partitions      int     `json:"partitions"`
	EventsPerSecond float64 `json:"events_per_second"` // one gateway, from its start to the watermark past the last event
	Seconds         float64 `json:"seconds"`
	Sessions        int64   `json:"sessions"` // live sessions after: one per user, none lost
	CPUs            int     `json:"cpus"`
	Go              string  `json:"go"`
}

func main() {
	events := flag.Int("events", 200000, "activity events on the topic")
	users := flag.Int("users", 50000, "distinct users they are spread over")
	partitions := flag.Int("partitions", 12, "partitions of the activity topic")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "activitybench:", err)
			os.Exit(1)
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := run(ctx, *events, *users, *partitions)
	if err != nil {
		fmt.Fprintln(os.Stderr, "activitybench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
}

func run(ctx context.Context, events, users, partitions int) (Report, error) {
	rep := Report{Events: events, Users: users, Partitions: partitions, CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if users < 1 || events < users {
		return rep, fmt.Errorf("want 1 <= users <= events")
	}
	rs, err := redisserver.Start(ctx, redisserver.Options{})
	if err != nil {
		return rep, err
	}
	defer rs.Close()
	kc, err := kafkatest.NewFake(kfake.SeedTopics(int32(partitions), activityfeed.DefaultTopic))
	if err != nil {
		return rep, fmt.Errorf("embedded kafka: %w", err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(activityfeed.DefaultTopic),
		kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return rep, err
	}
	defer prod.Close()
	recs := make([]*kgo.Record, 0, events)
	for i := range events {
		uid := fmt.Sprintf("u-%07d", i%users)
		recs = append(recs, &kgo.Record{Key: []byte(uid), Value: fmt.Appendf(nil, `{"uid":%q,"kind":"active"}`, uid)})
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return rep, fmt.Errorf("produce %d events: %w", events, err)
	}

	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	ks, err := session.NewKeyspace("st")
	if err != nil {
		return rep, err
	}
	store := session.NewStore(rdb, ks)
	produced, err := store.ActivityClock(ctx)
	if err != nil {
		return rep, err
	}

	env := map[string]string{
		"STILLTHERE_REDIS_ADDRS":               rs.Addr,
		"STILLTHERE_KAFKA_BROKERS":             strings.Join(brokers, ","),
		"STILLTHERE_GATEWAY_ADDR":              "127.0.0.1:0",
		"STILLTHERE_PUSH_ADDR":                 "127.0.0.1:0",
		"STILLTHERE_TOKEN_SECRET":              "activitybench-token-secret-0123456789abcdef",
		"STILLTHERE_PUSH_SECRET":               "activitybench-push-secret-0123456789abcdef",
		"STILLTHERE_ACTIVITY_FEED":             "true",
		"STILLTHERE_ACTIVITY_TOPIC_PARTITIONS": fmt.Sprint(partitions),
		"STILLTHERE_ACTIVITY_STAMP":            "50ms",
	}
	cfg, err := gateway.LoadConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		return rep, err
	}
	start := time.Now()
	gw, err := gateway.Open(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return rep, err
	}
	gctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- gw.Run(gctx) }()
	defer func() {
		cancel()
		<-done
		gw.Close()
	}()
	// Every partition's watermark past the last event: all applied.
	limit := time.After(10 * time.Minute)
	for {
		_, parts, err := store.ActivityWatermarks(ctx)
		if err == nil && len(parts) == partitions && lowest(parts).After(produced) {
			break
		}
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-limit:
			return rep, fmt.Errorf("the watermark did not pass the last event within 10m: %v", parts)
		case <-time.After(5 * time.Millisecond):
		}
	}
	took := time.Since(start)
	rep.Seconds = took.Seconds()
	rep.EventsPerSecond = float64(events) / took.Seconds()
	if rep.Sessions, err = store.Sessions(ctx); err != nil {
		return rep, err
	}
	if rep.Sessions != int64(users) {
		return rep, fmt.Errorf("%d live sessions after, want one per user, %d", rep.Sessions, users)
	}
	return rep, nil
}

func lowest(parts map[int32]time.Time) time.Time {
	var low time.Time
	for _, t := range parts {
		if low.IsZero() || t.Before(low) {
			low = t
		}
	}
	return low
}
