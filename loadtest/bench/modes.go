package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// modesScale sizes the side-by-side step.
type modesScale struct {
	Conns  int           // per gateway, so per mode
	Every  time.Duration // ping interval
	Ramp   int           // connections per second, per gateway
	Idle   time.Duration // held without pings once up; the idle figures are taken within it
	Window time.Duration // measured, once every connection has pinged
	Leave  time.Duration
}

// The modes compared, the new one first.
var readModes = []string{"epoll", "goroutine"}

// ModeResult is one read mode's gateway in the side-by-side step. Per
// connection figures are of what the load added to the gateway idle
// before it.
type ModeResult struct {
	Mode    string  `json:"mode"`
	Gateway string  `json:"gateway"`
	Conns   float64 `json:"conns"` // the gateway's open connections at the end of the window

	RSSBaseMB      float64 `json:"rss_base_mb"`
	IdleRSSPerConn float64 `json:"idle_rss_per_conn_kb"`
	IdleHeap       float64 `json:"idle_go_heap_inuse_per_conn_kb"`
	IdleStack      float64 `json:"idle_go_stack_inuse_per_conn_kb"`
	IdleOther      float64 `json:"idle_rss_outside_heap_and_stacks_per_conn_kb"`
	IdleGoroutines float64 `json:"idle_goroutines"`
	RSSPerConn     float64 `json:"rss_per_conn_kb"` // pinging, at the end of the window
	HeapPerConn    float64 `json:"go_heap_inuse_per_conn_kb"`
	StackPerConn   float64 `json:"go_stack_inuse_per_conn_kb"`
	OtherPerConn   float64 `json:"rss_outside_heap_and_stacks_per_conn_kb"`
	Goroutines     float64 `json:"goroutines"`

	CPUCores     float64 `json:"cpu_cores"`
	Pings        float64 `json:"pings"` // ping frames the gateway took in the window
	CPUmsPer1000 float64 `json:"cpu_ms_per_1000_pings"`
	Renewals     float64 `json:"renewals"`
	RoundTrips   float64 `json:"round_trips"`
	RenPerTrip   float64 `json:"renewals_per_round_trip"`
	TripsPerRen  float64 `json:"round_trips_per_renewal"`
	// FlushMs is a renewal round trip's mean time, batch sent to replies
	// read. A batch gathers what comes in while the one before is in
	// flight, so beside the batches' size it tells whether a mode's
	// smaller batches come from quicker round trips or from when its
	// renewals arrive.
	FlushMs float64 `json:"round_trip_mean_ms"`
	// RenewalMs is a renewal's mean time from its ping to its reply read:
	// its wait for a round trip (the renewer's flush window, and the one
	// in flight before it) and the round trip. The wait, RenewalMs less
	// FlushMs, is what sets a batch's size at a given rate of pings.
	RenewalMs float64 `json:"renewal_mean_ms"`

	// Load is the wsload holding this gateway's connections, and Pong
	// its ping→pong figures over the window.
	Load    loadResult  `json:"wsload"`
	Pong    pongFigures `json:"ping_pong_window"`
	HeapTop string      `json:"heap_profile_top"`

	// Parts are the same figures over consecutive parts of the window,
	// taken at the same moments for both modes: the goals that compare
	// the modes are judged part by part too, so that one part's hiccup
	// on this shared machine is told from a mode that is worse.
	Parts []modePart `json:"parts"`
}

// modePart is one part of the window's figures of one mode.
type modePart struct {
	Pong        pongFigures `json:"ping_pong"`
	Renewals    float64     `json:"renewals"`
	TripsPerRen float64     `json:"round_trips_per_renewal"`
}

// modeParts is how many parts the window is measured in.
const modeParts = 5

// Modes is the side-by-side step's result.
type Modes struct {
	Command string `json:"command"`
	// Supported: the gateway has the read mode setting; without it both
	// gateways read with a goroutine per connection.
	Supported bool    `json:"gateway_has_read_mode"`
	Conns     int     `json:"conns_per_mode"`
	PingEvery string  `json:"ping_every"`
	IdleSec   float64 `json:"idle_measured_after_seconds"`
	WindowSec float64 `json:"window_seconds"`
	// IdleClean: every connection was still idle when the idle figures
	// were taken.
	IdleClean   bool         `json:"idle_clean"`
	Modes       []ModeResult `json:"modes"`
	GatewayLogs []string     `json:"gateway_logs"`
}

// mode returns the result of one mode, or nil.
func (m *Modes) mode(name string) *ModeResult {
	for i := range m.Modes {
		if m.Modes[i].Mode == name {
			return &m.Modes[i]
		}
	}
	return nil
}

// The gateway's renewal counters, as its metrics name them.
const (
	renewalsMetric = "stillthere_gateway_renewals_total"
	tripsMetric    = "stillthere_gateway_renewal_round_trips_total"
	flushSumMetric = "stillthere_gateway_renewal_flush_seconds_sum"
	flushCntMetric = "stillthere_gateway_renewal_flush_seconds_count"
	renewSumMetric = "stillthere_gateway_renewal_seconds_sum"
	renewCntMetric = "stillthere_gateway_renewal_seconds_count"
)

// modes runs one gateway per read mode side by side, each held by a
// wsload of its own with the same number of connections and pings, so
// that both share the machine alike: first idle (connections up, no
// pings), then pinging.
func modes(ctx context.Context, bin, redisAddr string, s secrets, sc modesScale, command string) (*Modes, error) {
	r := &Modes{Command: command, Supported: gatewayReadModes(ctx, bin), Conns: sc.Conns, PingEvery: sc.Every.String()}
	var gws []*gateway
	defer func() {
		var wg sync.WaitGroup
		for _, g := range gws {
			wg.Go(g.stop)
		}
		wg.Wait()
	}()
	for _, m := range readModes {
		g, err := startGateway(ctx, bin, redisAddr, "bench-mode-"+m, s, readModeEnv+"="+m)
		if err != nil {
			return r, err
		}
		gws = append(gws, g)
	}
	time.Sleep(time.Second)
	base := make([]float64, len(gws))
	mBase := make([]map[string]float64, len(gws))
	for i, g := range gws {
		base[i], mBase[i] = rssKB(g.pid()), g.metrics()
	}

	fmt.Printf("modes: %d connections on each of %d gateways (%v), idle then pinging every %v\n", sc.Conns, len(gws), readModes, sc.Every)
	rampTime := time.Duration(sc.Conns) * time.Second / time.Duration(sc.Ramp)
	var fleets []*fleet
	defer func() {
		for _, f := range fleets {
			f.stop() // a no-op once the results are read
		}
	}()
	for i, g := range gws {
		f, err := startFleet(ctx, bin, s, fleetSpec{
			tag: "m" + readModes[i][:1], netByte: 30 + i, conns: sc.Conns, procs: 1, every: sc.Every,
			ramp: sc.Ramp, maxHold: 3*rampTime + sc.Idle + sc.Every + sc.Window + 5*time.Minute,
			ipsEach: 1, gateways: []*gateway{g}, leave: sc.Leave, idle: sc.Idle,
		})
		fleets = append(fleets, f)
		if err != nil {
			return r, err
		}
	}
	wait := func(d time.Duration, what string, w func(*fleet, context.Context) error) error {
		wctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		for _, f := range fleets {
			if err := w(f, wctx); err != nil {
				return fmt.Errorf("wsload %s: %w", what, err)
			}
		}
		return nil
	}
	if err := wait(5*rampTime+5*time.Minute, "ramp", (*fleet).waitRamped); err != nil {
		return r, err
	}
	// Idle: every connection up, none pinging yet. Halfway into the
	// idle hold, so that the ramp's garbage has been collected.
	idleAt := time.Now()
	sleep(ctx, sc.Idle/2)
	r.IdleSec = time.Since(idleAt).Seconds()
	for i, g := range gws {
		m := g.metrics()
		res := ModeResult{Mode: readModes[i], Gateway: g.id, RSSBaseMB: base[i] / 1024}
		n := m["stillthere_gateway_connections"]
		if n > 0 {
			res.IdleRSSPerConn = (rssKB(g.pid()) - base[i]) / n
			res.IdleHeap = (m["go_memstats_heap_inuse_bytes"] - mBase[i]["go_memstats_heap_inuse_bytes"]) / 1024 / n
			res.IdleStack = (m["go_memstats_stack_inuse_bytes"] - mBase[i]["go_memstats_stack_inuse_bytes"]) / 1024 / n
			res.IdleOther = res.IdleRSSPerConn - res.IdleHeap - res.IdleStack
		}
		res.IdleGoroutines = m["go_goroutines"]
		r.Modes = append(r.Modes, res)
	}
	r.IdleClean = true
	for _, f := range fleets {
		for _, l := range f.procs {
			select {
			case <-l.pinging:
				r.IdleClean = false // a hold too short for this machine's pace
			default:
			}
		}
	}

	if err := wait(sc.Idle+time.Minute, "pings", (*fleet).waitPinging); err != nil {
		return r, err
	}
	sleep(ctx, sc.Every) // every connection has pinged
	cpu0 := make([]float64, len(gws))
	m0 := make([]map[string]float64, len(gws))
	for _, f := range fleets {
		if _, err := f.mark(ctx); err != nil {
			return r, err
		}
	}
	for i, g := range gws {
		cpu0[i], m0[i] = cpuSeconds(g.pid()), g.metrics()
	}
	t0 := time.Now()
	mPart := slices.Clone(m0)
	for range modeParts {
		sleep(ctx, sc.Window/modeParts)
		for i, f := range fleets {
			pong, err := f.mark(ctx)
			if err != nil {
				return r, err
			}
			r.Modes[i].Pong.add(pong)
			m := gws[i].metrics()
			part := modePart{Pong: pong, Renewals: m[renewalsMetric] - mPart[i][renewalsMetric]}
			if part.Renewals > 0 {
				part.TripsPerRen = (m[tripsMetric] - mPart[i][tripsMetric]) / part.Renewals
			}
			r.Modes[i].Parts = append(r.Modes[i].Parts, part)
			mPart[i] = m
		}
	}
	window := time.Since(t0).Seconds()
	r.WindowSec = window
	const ping = `stillthere_gateway_frames_total{type="ping"}`
	for i, g := range gws {
		m, rss, cpu := g.metrics(), rssKB(g.pid()), cpuSeconds(g.pid())
		res := &r.Modes[i]
		res.Conns = m["stillthere_gateway_connections"]
		res.Goroutines = m["go_goroutines"]
		if res.Conns > 0 {
			res.RSSPerConn = (rss - base[i]) / res.Conns
			res.HeapPerConn = (m["go_memstats_heap_inuse_bytes"] - mBase[i]["go_memstats_heap_inuse_bytes"]) / 1024 / res.Conns
			res.StackPerConn = (m["go_memstats_stack_inuse_bytes"] - mBase[i]["go_memstats_stack_inuse_bytes"]) / 1024 / res.Conns
			res.OtherPerConn = res.RSSPerConn - res.HeapPerConn - res.StackPerConn
		}
		res.CPUCores = (cpu - cpu0[i]) / window
		res.Pings = m[ping] - m0[i][ping]
		if res.Pings > 0 {
			res.CPUmsPer1000 = (cpu - cpu0[i]) * 1000 / (res.Pings / 1000)
		}
		res.Renewals = m[renewalsMetric] - m0[i][renewalsMetric]
		res.RoundTrips = m[tripsMetric] - m0[i][tripsMetric]
		if res.RoundTrips > 0 {
			res.RenPerTrip = res.Renewals / res.RoundTrips
		}
		if res.Renewals > 0 {
			res.TripsPerRen = res.RoundTrips / res.Renewals
		}
		if n := m[flushCntMetric] - m0[i][flushCntMetric]; n > 0 {
			res.FlushMs = (m[flushSumMetric] - m0[i][flushSumMetric]) * 1000 / n
		}
		if n := m[renewCntMetric] - m0[i][renewCntMetric]; n > 0 {
			res.RenewalMs = (m[renewSumMetric] - m0[i][renewSumMetric]) * 1000 / n
		}
	}
	for i, g := range gws {
		if top, err := g.heapTop(ctx, 16); err != nil {
			r.Modes[i].HeapTop = "profile failed: " + err.Error()
		} else {
			r.Modes[i].HeapTop = top
		}
	}
	var errs []error
	for i, f := range fleets {
		res, err := f.stop()
		r.Modes[i].Load = res
		errs = append(errs, err)
	}
	var tallies []*logTally
	for _, g := range gws {
		tallies = append(tallies, g.logs)
	}
	r.GatewayLogs = mergeTallies(tallies...)
	return r, errors.Join(errs...)
}
