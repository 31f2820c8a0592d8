package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

type renewScale struct {
	Conns   int
	Loaders int
	Every   time.Duration
	Window  time.Duration
}

// Renewals is step 2's result.
type Renewals struct {
	Command     string     `json:"command"`
	Conns       int        `json:"conns"`
	PingEvery   string     `json:"ping_every"`
	WindowSec   float64    `json:"window_seconds"`
	Rate        float64    `json:"renewals_per_second"`
	RoundTrips  float64    `json:"round_trips"`
	Renewals    float64    `json:"renewals"`
	TripsPerRen float64    `json:"round_trips_per_renewal"`
	RenPerTrip  float64    `json:"renewals_per_round_trip"`
	Errors      float64    `json:"renewal_errors"`
	GatewayCPU  float64    `json:"gateway_cpu_cores"`
	RedisCPU    float64    `json:"redis_cpu_cores"`
	Load        loadResult `json:"wsload"`
	GatewayLogs []string   `json:"gateway_logs"`
}

// renewals holds conns connections on one gateway, each pinging every
// interval (conns/interval renewals per second), and counts the Redis
// round trips that carry them.
func renewals(ctx context.Context, bin, redisAddr string, rdb *redis.Client, s secrets, sc renewScale, command string) (*Renewals, error) {
	r := &Renewals{Command: command, Conns: sc.Conns, PingEvery: sc.Every.String()}
	g, err := startGateway(ctx, bin, redisAddr, "bench-renew", s)
	if err != nil {
		return r, err
	}
	defer g.stop()
	fmt.Printf("renewals: %d connections pinging every %v\n", sc.Conns, sc.Every)
	ramp := 3000
	rampTime := time.Duration(sc.Conns) * time.Second / time.Duration(ramp)
	f, err := startFleet(ctx, bin, s, fleetSpec{
		tag: "r", netByte: 20, conns: sc.Conns, procs: sc.Loaders, every: sc.Every, ramp: ramp,
		maxHold: 3*rampTime + sc.Every + sc.Window + 5*time.Minute, ipsEach: 1, leave: rampTime, gateways: []*gateway{g},
	})
	defer f.stop() // a no-op once the results are read
	if err != nil {
		return r, err
	}
	rctx, cancel := context.WithTimeout(ctx, 3*rampTime+time.Minute)
	err = f.waitRamped(rctx)
	cancel()
	if err != nil {
		return r, fmt.Errorf("wsload ramp: %w", err)
	}
	sleep(ctx, sc.Every) // all up and pinging

	m0, cpu0, redis0, t0 := g.metrics(), cpuSeconds(g.pid()), redisCPU(ctx, rdb), time.Now()
	sleep(ctx, sc.Window)
	m1, cpu1, redis1 := g.metrics(), cpuSeconds(g.pid()), redisCPU(ctx, rdb)
	window := time.Since(t0).Seconds()

	r.Load, err = f.stop()
	r.GatewayLogs = g.logs.summary()
	r.WindowSec = window
	r.RoundTrips = m1["stillthere_gateway_renewal_round_trips_total"] - m0["stillthere_gateway_renewal_round_trips_total"]
	r.Renewals = m1["stillthere_gateway_renewals_total"] - m0["stillthere_gateway_renewals_total"]
	r.Rate = r.Renewals / window
	r.GatewayCPU = (cpu1 - cpu0) / window
	r.RedisCPU = (redis1 - redis0) / window
	if r.Renewals > 0 {
		r.TripsPerRen = r.RoundTrips / r.Renewals
	}
	if r.RoundTrips > 0 {
		r.RenPerTrip = r.Renewals / r.RoundTrips
	}
	r.Errors = m1[`stillthere_gateway_renewals_total{result="error"}`] - m0[`stillthere_gateway_renewals_total{result="error"}`]
	return r, err
}
