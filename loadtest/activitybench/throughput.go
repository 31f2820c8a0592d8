package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
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

// throughput fills rep's throughput figures: events already on the
// topic, one gateway started, timed until the feed's watermark has passed
// the last of them.
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
	cfg, err := gateway.LoadConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		return err
	}
	start := time.Now()
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
