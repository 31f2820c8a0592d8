package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkRenewerBatch renews in the gateway's shape: batches of 256
// renewals of distinct users through a Renewer, one pipeline each, with
// the timeline's hold notes off and on (a gateway's instance name; no
// hold is cancelled, as in nearly every renewal). It reports renewals/s,
// and Redis's own time per renewal (redis-µs/renewal), which the
// machine's other load touches least: what bounds one Redis.
func BenchmarkRenewerBatch(b *testing.B) {
	on := HoldNotes{Bounds: TimelineBounds{}.OrDefault(), Service: "gateway", Instance: "gateway-7d9f8c6b5-x2k4p"}
	for _, c := range []struct {
		name  string
		notes HoldNotes
	}{{"timeline-off", HoldNotes{}}, {"timeline-on", on}} {
		b.Run(c.name, func(b *testing.B) { benchRenewerBatch(b, c.notes) })
	}
}

func benchRenewerBatch(b *testing.B, notes HoldNotes) {
	s, ctx := newStoreTB(b)
	s = s.WithHoldNotes(notes)
	const batch = 256
	r := NewRenewer(s, RenewerConfig{MaxBatch: batch, FlushInterval: time.Second})
	rctx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { r.Run(rctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	renew := func(n int) {
		var wg sync.WaitGroup
		wg.Add(batch)
		for i := range batch {
			r.RenewAsync(fmt.Sprintf("u%06d", (n*batch+i)%200000), "default", time.Minute, ClockPresence,
				func(_ time.Time, err error) {
					if err != nil {
						b.Error(err)
					}
					wg.Done()
				})
		}
		wg.Wait()
	}
	renew(0) // the script cached
	if err := s.rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for n := 0; b.Loop(); n++ {
		renew(n)
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "renewals/s")
	reportRedisMicros(b, s.rdb, int64(b.N)*batch, "redis-µs/renewal")
	reportRedisInput(b, s.rdb, int64(b.N)*batch, "req-B/renewal")
}

// reportRedisMicros reports Redis's time in scripts (EVALSHA) per one of
// n operations, as unit.
func reportRedisMicros(b *testing.B, rdb redis.UniversalClient, n int64, unit string) {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			var calls, usec int64
			for _, kv := range strings.Split(strings.TrimSpace(rest), ",") {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "calls":
					fmt.Sscan(v, &calls)
				case "usec":
					fmt.Sscan(v, &usec)
				}
			}
			if calls > 0 && n > 0 {
				b.ReportMetric(float64(usec)/float64(n), unit)
			}
		}
	}
}

// reportRedisInput reports the bytes Redis read from its clients (since
// the stats were reset) per one of n operations, as unit: what the
// operation costs on the wire, which no other load on the machine moves.
func reportRedisInput(b *testing.B, rdb redis.UniversalClient, n int64, unit string) {
	b.Helper()
	info, err := rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_net_input_bytes:"); ok {
			var in int64
			fmt.Sscan(v, &in)
			if n > 0 {
				b.ReportMetric(float64(in)/float64(n), unit)
			}
		}
	}
}

// BenchmarkAppendTimeline appends timeline entries as the services'
// recorders do in a storm: batches of 512 entries of distinct users, one
// script call per bucket in one pipeline, each user's timeline short of
// its bound. It reports Redis's own time per entry (redis-µs/entry).
func BenchmarkAppendTimeline(b *testing.B) {
	s, ctx := newStoreTB(b)
	bounds := TimelineBounds{}.OrDefault()
	const batch = 512
	recs := make([]TimelineRecord, batch)
	appendBatch := func(n int) {
		for i := range recs {
			recs[i] = TimelineRecord{UID: fmt.Sprintf("u%06d", (n*batch+i)%100000),
				Entry: `{"service":"expiry-listener","event":"held","rule":"brake","release_ms":1796041986000}`}
		}
		if _, err := s.AppendTimeline(ctx, recs, bounds); err != nil {
			b.Fatal(err)
		}
	}
	appendBatch(0) // the script cached
	if err := s.rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	for n := 0; b.Loop(); n++ {
		appendBatch(n)
	}
	reportRedisMicros(b, s.rdb, int64(b.N)*batch, "redis-µs/entry")
}

// BenchmarkClaimTimeouts claims dedup keys as a storm's release does:
// batches of 2,048 timeouts of distinct users, one script call per
// bucket, each key new. It reports Redis's own time per claim
// (redis-µs/claim).
func BenchmarkClaimTimeouts(b *testing.B) {
	s, ctx := newStoreTB(b)
	const batch = 2048
	es := make([]Expired, batch)
	base := time.UnixMilli(1796041986000)
	claimBatch := func(n int) {
		for i := range es {
			d := base.Add(time.Duration(n) * time.Minute)
			es[i] = Expired{UID: fmt.Sprintf("u%06d", i), Stage: 1, Deadline: d, Due: d}
		}
		if _, errs := s.ClaimTimeouts(ctx, es, "listener-bench", time.Minute); errors.Join(errs...) != nil {
			b.Fatal(errors.Join(errs...))
		}
	}
	claimBatch(0) // the script cached
	if err := s.rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	for n := 1; b.Loop(); n++ {
		claimBatch(n)
	}
	reportRedisMicros(b, s.rdb, int64(b.N)*batch, "redis-µs/claim")
}
