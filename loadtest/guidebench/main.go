// Command guidebench measures the guide consumer on this machine: guides
// per second for one replica against a fast downstream, and the time from
// a downstream's recovery to an empty backlog after an outage. It starts
// its own redis-server and embedded Kafka, runs one consumer in process
// against an in-process push endpoint that dedupes on the guide id like
// the gateway's, and prints its figures as one JSON object on stdout.
//
//	go run ./loadtest/guidebench -events 20000 -queued 10000
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/push/pushtest"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

const (
	topic  = "session-timeouts"
	group  = "guidebench"
	secret = "guidebench-push-secret-0123456789abcdef"
)

// Report is what guidebench prints.
type Report struct {
	Events          int     `json:"events"`
	Partitions      int     `json:"partitions"`
	MaxInFlight     int     `json:"max_in_flight"`
	GuidesPerSecond float64 `json:"guides_per_second"` // one replica, first to last delivery

	Queued                 int     `json:"queued"`
	BreakerTimeoutSeconds  float64 `json:"breaker_timeout_seconds"`
	RecoveryToFirstSeconds float64 `json:"recovery_to_first_guide_seconds"`   // mostly the wait for the breaker's probe
	RecoveryToEmptySeconds float64 `json:"recovery_to_empty_backlog_seconds"` // every queued guide delivered and committed
	DrainGuidesPerSecond   float64 `json:"drain_guides_per_second"`           // first to last delivery after recovery
	ResentIDs              int     `json:"resent_ids"`                        // guide ids pushed more than once; the dedupe showed each once

	CPUs int    `json:"cpus"`
	Go   string `json:"go"`
}

func main() {
	events := flag.Int("events", 20000, "events for the throughput run")
	queued := flag.Int("queued", 10000, "events queued during the outage")
	partitions := flag.Int("partitions", 12, "partitions of the timeout topic")
	maxInFlight := flag.Int("max-in-flight", 256, "the consumer's max-in-flight")
	breakerTimeout := flag.Duration("breaker-timeout", 10*time.Second, "the consumer's breaker-timeout")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run (the consumer, the embedded Kafka and the push endpoint: all in this process) to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "guidebench:", err)
			os.Exit(1)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "guidebench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	rep, err := run(ctx, log, *events, *queued, *partitions, *maxInFlight, *breakerTimeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "guidebench:", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
}

func run(ctx context.Context, log *slog.Logger, events, queued, partitions, maxInFlight int, breakerTimeout time.Duration) (Report, error) {
	rep := Report{Events: events, Partitions: partitions, MaxInFlight: maxInFlight, Queued: queued,
		BreakerTimeoutSeconds: breakerTimeout.Seconds(), CPUs: runtime.NumCPU(), Go: runtime.Version()}

	rs, err := redisserver.Start(ctx, redisserver.Options{})
	if err != nil {
		return rep, err
	}
	defer rs.Close()
	kc, err := kafkatest.NewFake(kfake.SeedTopics(int32(partitions), topic))
	if err != nil {
		return rep, fmt.Errorf("embedded kafka: %w", err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()

	down := pushtest.NewRecorder(secret)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return rep, err
	}
	srv := &http.Server{Handler: down}
	go srv.Serve(ln)
	defer srv.Close()

	env := map[string]string{
		"STILLTHERE_REDIS_ADDRS":         rs.Addr,
		"STILLTHERE_KAFKA_BROKERS":       strings.Join(brokers, ","),
		"STILLTHERE_TOPIC":               topic,
		"STILLTHERE_TOPIC_PARTITIONS":    fmt.Sprint(partitions),
		"STILLTHERE_CONSUMER_ADMIN_ADDR": "127.0.0.1:0",
		"STILLTHERE_CONSUMER_GROUP":      group,
		"STILLTHERE_PUSH_URL":            "http://" + ln.Addr().String() + "/v1/push",
		"STILLTHERE_PUSH_SECRET":         secret,
		"STILLTHERE_MAX_IN_FLIGHT":       fmt.Sprint(maxInFlight),
		"STILLTHERE_BREAKER_TIMEOUT":     breakerTimeout.String(),
	}
	cfg, err := guide.LoadConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		return rep, err
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return rep, err
	}
	defer prod.Close()
	adm := kadm.NewClient(prod)

	// Throughput: the events wait on the topic, then one replica starts.
	if err := produce(ctx, prod, "tp", events); err != nil {
		return rep, err
	}
	c, err := guide.Open(ctx, cfg, log)
	if err != nil {
		return rep, err
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		c.Close()
		<-done
	}()
	if err := waitFor(ctx, 10*time.Minute, func() bool { return down.Delivered() >= int64(events) }); err != nil {
		return rep, fmt.Errorf("throughput run: %d of %d delivered: %w", down.Delivered(), events, err)
	}
	first, last := down.Span()
	if events > 1 {
		rep.GuidesPerSecond = float64(events-1) / last.Sub(first).Seconds()
	}
	if err := waitEmpty(ctx, adm); err != nil {
		return rep, err
	}

	// Outage: the downstream answers 503 while events queue up.
	down.ResetSpan()
	down.SetDown(true)
	if err := produce(ctx, prod, "q", queued); err != nil {
		return rep, err
	}
	// The breaker has opened and the consumer holds what it took.
	if err := waitFor(ctx, time.Minute, func() bool { return down.Refused() >= int64(cfg.BreakerFailures) }); err != nil {
		return rep, fmt.Errorf("outage never reached the consumer: %w", err)
	}
	time.Sleep(breakerTimeout / 2) // land mid-way between two probes
	base := down.Delivered()
	recovered := time.Now()
	down.SetDown(false)
	if err := waitFor(ctx, 10*time.Minute, func() bool { return down.Delivered()-base >= int64(queued) }); err != nil {
		return rep, fmt.Errorf("after recovery: %d of %d delivered: %w", down.Delivered()-base, queued, err)
	}
	if err := waitEmpty(ctx, adm); err != nil {
		return rep, err
	}
	rep.RecoveryToEmptySeconds = time.Since(recovered).Seconds()
	first, last = down.Span()
	rep.RecoveryToFirstSeconds = first.Sub(recovered).Seconds()
	if queued > 1 {
		rep.DrainGuidesPerSecond = float64(queued-1) / last.Sub(first).Seconds()
	}
	rep.ResentIDs = down.Resent()
	return rep, nil
}

// produce writes n timeout events for distinct users, keyed by uid.
func produce(ctx context.Context, prod *kgo.Client, prefix string, n int) error {
	now := time.Now().Add(-time.Second)
	recs := make([]*kgo.Record, 0, n)
	for i := range n {
		uid := fmt.Sprintf("%s-%07d", prefix, i)
		ev := timeoutevent.New(uid, session.DefaultSegment, now, now, timeoutevent.SourceSweep)
		b, err := ev.Marshal()
		if err != nil {
			return err
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(uid), Value: b})
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("produce %d events: %w", n, err)
	}
	return nil
}

// waitEmpty waits until the group has committed every record of the topic.
func waitEmpty(ctx context.Context, adm *kadm.Client) error {
	return waitFor(ctx, 10*time.Minute, func() bool {
		lags, err := adm.Lag(ctx, group)
		if err != nil {
			return false
		}
		l := lags[group]
		return l.Error() == nil && l.Lag.Total() == 0 && !l.Lag.IsEmpty()
	})
}

func waitFor(ctx context.Context, limit time.Duration, cond func() bool) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	deadline := time.After(limit)
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("not within %v", limit)
		case <-t.C:
		}
	}
	return nil
}
