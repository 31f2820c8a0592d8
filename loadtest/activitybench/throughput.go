package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"syscall"
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

// Throughput is one run of the throughput part.
type Throughput struct {
	// RedisMasters is the Redis it ran on: 1, one redis-server; more, a
	// Redis Cluster of that many masters, the slots split evenly.
	RedisMasters    int     `json:"redis_masters"`
	EventsPerSecond float64 `json:"events_per_second"` // one gateway, from its start to the watermark past the last event
	Seconds         float64 `json:"seconds"`
	Sessions        int64   `json:"sessions"` // live sessions after: one per user, none lost
	// Redis is what Redis did per event, over all its masters, and
	// RedisCores each master's main thread's CPU over the run, in cores:
	// one near 1 is the bound. ProcessCPUMicros is the CPU this process
	// used per event meanwhile: the gateway's, with the in-process
	// Kafka's.
	Redis            *RedisCost `json:"redis_per_event"`
	RedisCores       []float64  `json:"redis_cores"`
	ProcessCPUMicros float64    `json:"process_cpu_micros_per_event"`
}

// maxBatch is the feed's batch setting for the throughput part; 0: the
// gateway's default.
var maxBatch int

// throughput measures one run: events already on the topic, one gateway
// started on a Redis of masters masters, timed until the feed's
// watermark has passed the last of them.
func throughput(ctx context.Context, events, users, partitions, masters int) (Throughput, error) {
	res := Throughput{RedisMasters: masters}
	if users < 1 || events < users {
		return res, fmt.Errorf("want 1 <= users <= events")
	}
	var addrs []string
	if masters > 1 {
		c, err := redisserver.StartCluster(ctx, "", masters)
		if err != nil {
			return res, err
		}
		defer c.Close()
		addrs = c.Addrs()
	} else {
		rs, err := redisserver.Start(ctx, redisserver.Options{})
		if err != nil {
			return res, err
		}
		defer rs.Close()
		addrs = []string{rs.Addr}
	}
	kc, err := kafkatest.NewFake(kfake.SeedTopics(int32(partitions), activityfeed.DefaultTopic))
	if err != nil {
		return res, fmt.Errorf("embedded kafka: %w", err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(activityfeed.DefaultTopic),
		kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return res, err
	}
	defer prod.Close()
	recs := make([]*kgo.Record, 0, events)
	for i := range events {
		uid := fmt.Sprintf("u-%07d", i%users)
		recs = append(recs, &kgo.Record{Key: []byte(uid), Value: fmt.Appendf(nil, `{"uid":%q,"kind":"active"}`, uid)})
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return res, fmt.Errorf("produce %d events: %w", events, err)
	}

	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs, IsClusterMode: masters > 1})
	defer rdb.Close()
	// Each master on its own, for its CPU and command counts.
	nodes := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: a})
		defer nodes[i].Close()
	}
	ks, err := session.NewKeyspace("st")
	if err != nil {
		return res, err
	}
	store := session.NewStore(rdb, ks)
	produced, err := store.ActivityClock(ctx)
	if err != nil {
		return res, err
	}

	env := map[string]string{
		"STILLTHERE_REDIS_ADDRS":               strings.Join(addrs, ","),
		"STILLTHERE_KAFKA_BROKERS":             strings.Join(brokers, ","),
		"STILLTHERE_GATEWAY_ADDR":              "127.0.0.1:0",
		"STILLTHERE_PUSH_ADDR":                 "127.0.0.1:0",
		"STILLTHERE_TOKEN_SECRET":              "activitybench-token-secret-0123456789abcdef",
		"STILLTHERE_PUSH_SECRET":               "activitybench-push-secret-0123456789abcdef",
		"STILLTHERE_ACTIVITY_FEED":             "true",
		"STILLTHERE_ACTIVITY_TOPIC_PARTITIONS": fmt.Sprint(partitions),
		"STILLTHERE_ACTIVITY_STAMP":            "50ms",
	}
	if maxBatch > 0 {
		env["STILLTHERE_ACTIVITY_MAX_BATCH"] = strconv.Itoa(maxBatch)
	}
	cfg, err := gateway.LoadConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		return res, err
	}
	before, err := readCosts(ctx, nodes)
	if err != nil {
		return res, err
	}
	start, self0 := time.Now(), selfCPU()
	gw, err := gateway.Open(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return res, err
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
			return res, ctx.Err()
		case <-limit:
			return res, fmt.Errorf("the watermark did not pass the last event within 10m: %v", parts)
		case <-time.After(5 * time.Millisecond):
		}
	}
	took := time.Since(start)
	res.Seconds = took.Seconds()
	res.EventsPerSecond = float64(events) / took.Seconds()
	after, err := readCosts(ctx, nodes)
	if err != nil {
		return res, err
	}
	res.Redis = perEvent(before, after, events)
	for i := range nodes {
		res.RedisCores = append(res.RedisCores, round((after[i].cpu-before[i].cpu).Seconds()/took.Seconds()))
	}
	res.ProcessCPUMicros = round(float64((selfCPU() - self0).Microseconds()) / float64(events))
	if res.Sessions, err = store.Sessions(ctx); err != nil {
		return res, err
	}
	if res.Sessions != int64(users) {
		return res, fmt.Errorf("%d live sessions after, want one per user, %d", res.Sessions, users)
	}
	return res, nil
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

// RedisCost is what Redis did per event over the run (the gateway's
// start and stamps included), summed over its masters: the CPU time of
// their main threads, and by INFO commandstats the calls of each command
// and the time spent in it, those the scripts call counted inside
// EVALSHA's as well as on their own line.
type RedisCost struct {
	CPUMicros float64            `json:"cpu_micros"`
	Calls     map[string]float64 `json:"calls"`
	Micros    map[string]float64 `json:"micros"`
}

// nodeCost is one master's counters at one time.
type nodeCost struct {
	cpu   time.Duration // its main thread's
	calls map[string]float64
	usec  map[string]float64
}

// readCosts reads each master's counters.
func readCosts(ctx context.Context, nodes []*redis.Client) ([]nodeCost, error) {
	out := make([]nodeCost, len(nodes))
	for i, rdb := range nodes {
		info, err := rdb.Info(ctx, "cpu", "commandstats").Result()
		if err != nil {
			return nil, fmt.Errorf("info: %w", err)
		}
		c := nodeCost{calls: map[string]float64{}, usec: map[string]float64{}}
		for _, line := range strings.Split(info, "\n") {
			line = strings.TrimSpace(line)
			k, v, _ := strings.Cut(line, ":")
			if k == "used_cpu_sys_main_thread" || k == "used_cpu_user_main_thread" {
				var f float64
				fmt.Sscan(v, &f)
				c.cpu += time.Duration(f * float64(time.Second))
			}
			name, ok := strings.CutPrefix(k, "cmdstat_")
			if !ok {
				continue
			}
			for _, kv := range strings.Split(v, ",") {
				k, v, _ := strings.Cut(kv, "=")
				var f float64
				fmt.Sscan(v, &f)
				switch k {
				case "calls":
					c.calls[name] = f
				case "usec":
					c.usec[name] = f
				}
			}
		}
		out[i] = c
	}
	return out, nil
}

// perEvent is what every master did between before and after, summed,
// per one of events.
func perEvent(before, after []nodeCost, events int) *RedisCost {
	n := float64(events)
	c := &RedisCost{Calls: map[string]float64{}, Micros: map[string]float64{}}
	var cpu time.Duration
	for i := range after {
		cpu += after[i].cpu - before[i].cpu
		for name, v := range after[i].calls {
			c.Calls[name] += v - before[i].calls[name]
		}
		for name, v := range after[i].usec {
			c.Micros[name] += v - before[i].usec[name]
		}
	}
	c.CPUMicros = round(float64(cpu.Microseconds()) / n)
	for name, v := range c.Calls {
		c.Calls[name] = round(v / n)
	}
	for name, v := range c.Micros {
		c.Micros[name] = round(v / n)
	}
	return c
}

func round(f float64) float64 { return math.Round(f*1000) / 1000 }

// selfCPU is the CPU time this process used so far: the gateway's, the
// in-process Kafka's and the watermark's polling.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
