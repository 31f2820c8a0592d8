package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// connScale sizes step 1.
type connScale struct {
	Gateways  int           `json:"gateways"`
	Conns     int           `json:"conns"`
	Loaders   int           `json:"wsload_processes"`
	Ramp      int           `json:"ramp_per_second"`
	Settle    time.Duration `json:"-"`
	Window    time.Duration `json:"-"`
	Pushes    int           `json:"pushes"`
	IPsPerGen int           `json:"source_addresses_per_wsload"`
	Leave     time.Duration `json:"-"`
	// ReadMode is the gateways' read mode (readModeEnv).
	ReadMode string `json:"read_mode"`
	// Every is each connection's ping interval.
	Every time.Duration `json:"-"`
	// Procs is GOMAXPROCS of each gateway and wsload process, 0 for Go's
	// default. With many processes on few cores each is a pod limited to
	// a fraction of a core, which Go's container-aware default runs with
	// one; two each, thirty processes' schedulers spin against each other.
	Procs int `json:"gomaxprocs_each"`
	// TTL and Idle are the gateways' session TTL and idle timeout, 0 for
	// their defaults (60 s each): a client that pings less often than
	// every 48 s needs both longer, as a deployment that chose that
	// cadence sets them.
	TTL  time.Duration `json:"-"`
	Idle time.Duration `json:"-"`
	// Step names the step in the report (1, 1b); Tag and NetByte keep its
	// users and source addresses apart from another step's.
	Step    string `json:"-"`
	Tag     string `json:"-"`
	NetByte int    `json:"-"`
}

// procsEnv is the environment that sets Procs.
func (sc connScale) procsEnv() []string {
	if sc.Procs <= 0 {
		return nil
	}
	return []string{"GOMAXPROCS=" + strconv.Itoa(sc.Procs)}
}

// gatewayID is the instance id of the step's gateway i: bench-gw-0 in
// step 1, bench-gw1b-0 in step 1b, so that no instance of one step is
// taken for a restart of the other's.
func (sc connScale) gatewayID(i int) string {
	if sc.Step == "1" {
		return fmt.Sprintf("bench-gw-%d", i)
	}
	return fmt.Sprintf("bench-gw%s-%d", sc.Step, i)
}

// gatewayEnv is a gateway's environment for the step.
func (sc connScale) gatewayEnv() []string {
	env := append(sc.procsEnv(), readModeEnv+"="+sc.ReadMode)
	if sc.TTL > 0 {
		env = append(env, "STILLTHERE_SESSION_TTL="+sc.TTL.String())
	}
	if sc.Idle > 0 {
		env = append(env, "STILLTHERE_IDLE_TIMEOUT="+sc.Idle.String())
	}
	return env
}

// ConnGateway is one gateway's share of step 1.
type ConnGateway struct {
	ID            string  `json:"id"`
	Conns         float64 `json:"conns"`
	RSSBaseMB     float64 `json:"rss_base_mb"`
	RSSMB         float64 `json:"rss_mb"`
	RSSPerConnKB  float64 `json:"rss_per_conn_kb"`
	CPUCores      float64 `json:"cpu_cores"`
	HeapPerConnKB float64 `json:"go_heap_inuse_per_conn_kb"`
	StackPerConn  float64 `json:"go_stack_inuse_per_conn_kb"`
	Goroutines    float64 `json:"goroutines"`
}

// Connections is step 1's result.
type Connections struct {
	// Step is 1 (memory per connection at 15 s pings) or 1b (the most
	// connections held, at a slower cadence).
	Step    string `json:"step"`
	Command string `json:"command"`
	// ReadMode is how the gateways read their connections: the mode
	// asked for, or "goroutine" from a gateway without the setting.
	ReadMode     string        `json:"gateway_read_mode"`
	Gateways     int           `json:"gateways"`
	Target       int           `json:"target_conns"`
	Loaders      int           `json:"wsload_processes"`
	IPsPerLoader int           `json:"source_addresses_per_wsload"`
	PingEvery    string        `json:"ping_every"`
	SessionTTL   string        `json:"session_ttl,omitempty"`  // the gateways' default when empty
	IdleTimeout  string        `json:"idle_timeout,omitempty"` // the gateways' default when empty
	WindowSec    float64       `json:"window_seconds"`
	Held         float64       `json:"sessions_held"` // sum of the gateways' open connections at the end of the window
	Load         loadResult    `json:"wsload"`
	Pong         pongFigures   `json:"ping_pong_window"` // at the load generator, over the window
	PerGateway   []ConnGateway `json:"per_gateway"`
	RSSPerConnKB float64       `json:"rss_per_conn_kb"` // over all gateways: added RSS / connections
	HeapPerConn  float64       `json:"go_heap_inuse_per_conn_kb"`
	StackPerConn float64       `json:"go_stack_inuse_per_conn_kb"`
	OtherPerConn float64       `json:"rss_outside_heap_and_stacks_per_conn_kb"`
	GatewayCPU   float64       `json:"gateway_cpu_cores"` // all gateways
	LoadCPU      float64       `json:"wsload_cpu_cores"`
	LoadRSSMB    float64       `json:"wsload_rss_mb"`
	RedisCPU     float64       `json:"redis_cpu_cores"`
	Renewals     float64       `json:"renewals_per_second"`
	TripsPerRen  float64       `json:"round_trips_per_renewal"`
	HeapTop      string        `json:"heap_profile_top"` // gateway 0
	GatewayLogs  []string      `json:"gateway_logs"`     // lines by level and message, all gateways, the closes at the end included

	// Push routing: guides pushed through one gateway for users held by
	// another.
	Pushed        int `json:"pushes"`
	PushDelivered int `json:"push_delivered"`
	PushErrors    int `json:"push_errors"`
	PushRetries   int `json:"push_retries"` // sends again the gateway asked for (409, 503)
	GuidesLost    int `json:"guides_lost"`
	GuidesDoubled int `json:"guides_doubled"`
}

func connections(ctx context.Context, bin, redisAddr string, rdb *redis.Client, s secrets, sc connScale, command string) (*Connections, error) {
	r := &Connections{Step: sc.Step, Command: command, Gateways: sc.Gateways, Target: sc.Conns, Loaders: sc.Loaders, IPsPerLoader: sc.IPsPerGen, PingEvery: sc.Every.String(),
		ReadMode: "goroutine"}
	if sc.TTL > 0 {
		r.SessionTTL = sc.TTL.String()
	}
	if sc.Idle > 0 {
		r.IdleTimeout = sc.Idle.String()
	}
	if gatewayReadModes(ctx, bin) {
		r.ReadMode = sc.ReadMode
	}
	var gws []*gateway
	defer func() {
		var wg sync.WaitGroup
		for _, g := range gws {
			wg.Go(g.stop)
		}
		wg.Wait()
	}()
	for i := range sc.Gateways {
		g, err := startGateway(ctx, bin, redisAddr, sc.gatewayID(i), s, sc.gatewayEnv()...)
		if err != nil {
			return r, err
		}
		gws = append(gws, g)
	}
	time.Sleep(time.Second)
	// Memory before the load, so the per-connection figures leave out
	// what an idle gateway holds (Redis pools, buffers, the runtime).
	base := make([]float64, len(gws))
	mBase := make([]map[string]float64, len(gws))
	for i, g := range gws {
		base[i], mBase[i] = rssKB(g.pid()), g.metrics()
	}

	fmt.Printf("step %s: %d connections over %d gateways (read mode %s) from %d wsload processes, pings every %v\n", sc.Step, sc.Conns, sc.Gateways, r.ReadMode, sc.Loaders, sc.Every)
	rampTime := time.Duration(sc.Conns) * time.Second / time.Duration(sc.Ramp)
	f, err := startFleet(ctx, bin, s, fleetSpec{
		tag: sc.Tag, netByte: sc.NetByte, conns: sc.Conns, procs: sc.Loaders, every: sc.Every,
		ramp: sc.Ramp, maxHold: 3*rampTime + sc.Settle + sc.Window + 5*time.Minute,
		ipsEach: sc.IPsPerGen, gateways: gws, leave: sc.Leave, env: sc.procsEnv(),
	})
	defer f.stop() // a no-op once the results are read
	if err != nil {
		return r, err
	}
	// A busy machine ramps slower than asked; waitRamped fails on a
	// stalled ramp, this bounds a crawling one.
	rctx, cancel := context.WithTimeout(ctx, 5*rampTime+5*time.Minute)
	err = f.waitRamped(rctx)
	cancel()
	if err != nil {
		r.Load, _ = f.stop() // what did connect, and what failed
		return r, fmt.Errorf("wsload ramp: %w", err)
	}
	// Every connection pings once within a ping interval of its start.
	sleep(ctx, sc.Settle)

	cpu0 := make([]float64, len(gws))
	m0 := make([]map[string]float64, len(gws))
	for i, g := range gws {
		cpu0[i], m0[i] = cpuSeconds(g.pid()), g.metrics()
	}
	var load0 float64
	for _, pid := range f.pids() {
		load0 += cpuSeconds(pid)
	}
	redis0 := redisCPU(ctx, rdb)
	t0 := time.Now()
	if _, err := f.mark(ctx); err != nil { // ping→pong figures from here
		return r, err
	}

	// Guides pushed through the next gateway than the user's, so each is
	// routed over Redis Pub/Sub to the instance holding it.
	var delivered, pushErrs, pushRetries atomic.Int64
	var pushWG sync.WaitGroup
	pushWG.Go(func() {
		spacing := sc.Window / 2 / time.Duration(max(sc.Pushes, 1))
		sem := make(chan struct{}, 16)
		var wg sync.WaitGroup
		for k := range sc.Pushes {
			p := k % len(f.procs)
			i := (k / len(f.procs)) * 7 % f.procs[p].conns
			uid, on := f.uid(p, i)
			via := gws[(on+1)%len(gws)]
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				st, n, retries, err := via.pushRetrying(ctx, s, fmt.Sprintf("bench-route-%d", k), uid)
				pushRetries.Add(int64(retries))
				switch {
				case err != nil:
					pushErrs.Add(1)
					fmt.Println("push:", err)
				case st == "delivered" && n > 0:
					delivered.Add(1)
				}
			})
			time.Sleep(spacing)
		}
		wg.Wait()
	})
	sleep(ctx, sc.Window)
	pushWG.Wait()
	window := time.Since(t0).Seconds()
	if r.Pong, err = f.mark(ctx); err != nil {
		return r, err
	}
	r.WindowSec = window

	var heap, stack, added float64
	var trips, rens float64
	for i, g := range gws {
		m := g.metrics()
		rss := rssKB(g.pid())
		cg := ConnGateway{
			ID: g.id, Conns: m["stillthere_gateway_connections"],
			RSSBaseMB: base[i] / 1024, RSSMB: rss / 1024,
			CPUCores:   (cpuSeconds(g.pid()) - cpu0[i]) / window,
			Goroutines: m["go_goroutines"],
		}
		dHeap := (m["go_memstats_heap_inuse_bytes"] - mBase[i]["go_memstats_heap_inuse_bytes"]) / 1024
		dStack := (m["go_memstats_stack_inuse_bytes"] - mBase[i]["go_memstats_stack_inuse_bytes"]) / 1024
		if cg.Conns > 0 {
			cg.RSSPerConnKB = (rss - base[i]) / cg.Conns
			cg.HeapPerConnKB = dHeap / cg.Conns
			cg.StackPerConn = dStack / cg.Conns
		}
		r.PerGateway = append(r.PerGateway, cg)
		r.Held += cg.Conns
		r.GatewayCPU += cg.CPUCores
		added += rss - base[i]
		heap += dHeap
		stack += dStack
		trips += m["stillthere_gateway_renewal_round_trips_total"] - m0[i]["stillthere_gateway_renewal_round_trips_total"]
		rens += m["stillthere_gateway_renewals_total"] - m0[i]["stillthere_gateway_renewals_total"]
	}
	var load1 float64
	for _, pid := range f.pids() {
		load1 += cpuSeconds(pid)
		r.LoadRSSMB += rssKB(pid) / 1024
	}
	r.LoadCPU = (load1 - load0) / window
	r.RedisCPU = (redisCPU(ctx, rdb) - redis0) / window
	r.Renewals = rens / window
	if rens > 0 {
		r.TripsPerRen = trips / rens
	}
	if r.Held > 0 {
		r.RSSPerConnKB = added / r.Held
		r.HeapPerConn = heap / r.Held
		r.StackPerConn = stack / r.Held
		r.OtherPerConn = r.RSSPerConnKB - r.HeapPerConn - r.StackPerConn
	}
	if top, err := gws[0].heapTop(ctx, 22); err != nil {
		r.HeapTop = "profile failed: " + err.Error()
	} else {
		r.HeapTop = top
	}

	r.Load, err = f.stop()
	var tallies []*logTally
	for _, g := range gws {
		tallies = append(tallies, g.logs)
	}
	r.GatewayLogs = mergeTallies(tallies...)
	r.Pushed, r.PushDelivered, r.PushErrors, r.PushRetries = sc.Pushes, int(delivered.Load()), int(pushErrs.Load()), int(pushRetries.Load())
	r.GuidesLost = max(r.PushDelivered-r.Load.GuideIDs, 0)
	r.GuidesDoubled = r.Load.Guides - r.Load.GuideIDs
	return r, err
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
