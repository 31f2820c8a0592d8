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

// throughput fills rep's throughput figures: events already on the
// topic, one gateway started, timed until the feed's watermark has passed
// the last of them.
// maxBatch is the feed's batch setting for the throughput part; 0: the
// gateway's default.
var maxBatch int

func throughput(ctx context.Context, rep *Report, events, users, partitions int) error {
	rep.Events, rep.Users, rep.Partitions = events, users, partitions
	if users < 1 || events < users {
		return fmt.Errorf("want 1 <= users <= events")
	}
	rs, err := redisserver.Start(ctx, redisserver.Options{})
	if err != nil {
		return err
	}
	defer rs.Close()
	kc, err := kafkatest.NewFake(kfake.SeedTopics(int32(partitions), activityfeed.DefaultTopic))
	if err != nil {
		return fmt.Errorf("embedded kafka: %w", err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(activityfeed.DefaultTopic),
		kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer prod.Close()
	recs := make([]*kgo.Record, 0, events)
	for i := range events {
		uid := fmt.Sprintf("u-%07d", i%users)
		recs = append(recs, &kgo.Record{Key: []byte(uid), Value: fmt.Appendf(nil, `{"uid":%q,"kind":"active"}`, uid)})
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("produce %d events: %w", events, err)
	}

	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	ks, err := session.NewKeyspace("st")
	if err != nil {
		return err
	}
	store := session.NewStore(rdb, ks)
	produced, err := store.ActivityClock(ctx)
	if err != nil {
		return err
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
	if maxBatch > 0 {
		env["STILLTHERE_ACTIVITY_MAX_BATCH"] = strconv.Itoa(maxBatch)
	}
	cfg, err := gateway.LoadConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		return err
	}
	cpu0, err := redisCPU(ctx, rdb)
	if err != nil {
		return err
	}
	start, self0 := time.Now(), selfCPU()
	gw, err := gateway.Open(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err
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
			return ctx.Err()
		case <-limit:
			return fmt.Errorf("the watermark did not pass the last event within 10m: %v", parts)
		case <-time.After(5 * time.Millisecond):
		}
	}
	took := time.Since(start)
	rep.Seconds = took.Seconds()
	rep.EventsPerSecond = float64(events) / took.Seconds()
	if rep.Redis, err = redisCost(ctx, rdb, cpu0, events); err != nil {
		return err
	}
	rep.ProcessCPUMicros = round(float64((selfCPU() - self0).Microseconds()) / float64(events))
	if rep.Sessions, err = store.Sessions(ctx); err != nil {
		return err
	}
	if rep.Sessions != int64(users) {
		return fmt.Errorf("%d live sessions after, want one per user, %d", rep.Sessions, users)
	}
	return nil
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
// start and stamps included): the CPU time of its main thread, which
// bounds one Redis, and by INFO commandstats the calls of each command
// and the time spent in it, those the scripts call counted inside
// EVALSHA's as well as on their own line.
type RedisCost struct {
	CPUMicros float64            `json:"cpu_micros"`
	Calls     map[string]float64 `json:"calls"`
	Micros    map[string]float64 `json:"micros"`
}

// redisCPU is the CPU time Redis's main thread used so far.
func redisCPU(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("info cpu: %w", err)
	}
	var sec float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys_main_thread" || k == "used_cpu_user_main_thread" {
			var f float64
			fmt.Sscan(v, &f)
			sec += f
		}
	}
	return time.Duration(sec * float64(time.Second)), nil
}

// redisCost reads Redis's CPU since cpu0 and its INFO commandstats, per
// event.
func redisCost(ctx context.Context, rdb *redis.Client, cpu0 time.Duration, events int) (*RedisCost, error) {
	cpu, err := redisCPU(ctx, rdb)
	if err != nil {
		return nil, err
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("info commandstats: %w", err)
	}
	n := float64(events)
	c := &RedisCost{CPUMicros: float64((cpu - cpu0).Microseconds()) / n, Calls: map[string]float64{}, Micros: map[string]float64{}}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, stats, _ := strings.Cut(rest, ":")
		var calls, usec float64
		for _, kv := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				fmt.Sscan(v, &calls)
			case "usec":
				fmt.Sscan(v, &usec)
			}
		}
		c.Calls[name] = round(calls / n)
		c.Micros[name] = round(usec / n)
	}
	c.CPUMicros = round(c.CPUMicros)
	return c, nil
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
