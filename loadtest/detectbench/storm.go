package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/expiry"
)

// storm runs n sessions out within one second through a hybrid listener
// and a guide consumer with the webhook sender, against a webhook that
// answers 200 at once and records every guide id. Past the listener's
// mass-expiry threshold the brake holds the rest for the grace and checks
// each again before it is produced, so the storm is awaited for at least
// the grace (and 5 s more) past the window.
func (b *bench) storm(ctx context.Context, n int, wait time.Duration) (*StormResult, error) {
	cfg := b.idle.cfg
	res := &StormResult{Sessions: n, WindowMS: 1000, GraceMS: float64(b.grace.Milliseconds()),
		BrakeFloor: cfg.MassExpiryFloor, BrakeShare: cfg.MassExpiryShare, BrakeWindow: cfg.MassExpiryWindow.String(),
		ReleaseBusyMedian: -1, ReleaseBusyPeak: -1}
	topic := "storm"
	hook, stopPipeline, err := b.startGuides(ctx, expiry.ModeHybrid, 1, topic, "storm-", 0)
	if err != nil {
		return nil, err
	}
	defer stopPipeline()
	time.Sleep(time.Second)
	b.idle.stop() // the storm's listener marks sweeps now
	held0 := held()

	// Written before the window opens: the deadlines, not the writes,
	// fall within one second.
	lead := 3*time.Second + time.Duration(n/20000)*time.Second
	begin := time.Now()
	if err := b.renewMany(ctx, "storm", n, func(i int) time.Duration {
		return lead + time.Second*time.Duration(i)/time.Duration(n) - time.Since(begin)
	}); err != nil {
		return nil, err
	}
	if time.Since(begin) > lead {
		return nil, fmt.Errorf("writing %d sessions took %v, past the storm's start", n, time.Since(begin))
	}
	if stopProfile, err := startProfile(stormProfile); err != nil {
		return nil, err
	} else {
		defer stopProfile()
	}
	windowStart := begin.Add(lead)
	windowEnd := windowStart.Add(time.Second)
	wait = max(wait, b.grace+minWaitPastGrace)
	deadline := windowEnd.Add(wait)
	// Redis's cost from the window's start, and from when the brake's
	// holds fall due (the window's start plus the grace).
	var atWindow, atRelease redisCost
	var cpuAtRelease cpuUse
	// The release's own profile, from the first release to the last
	// guide (-storm-release-cpuprofile): started by the goroutine below,
	// stopped once it is done.
	stopReleaseProfile := func() {}
	costs := make(chan struct{})
	cctx, cancelCosts := context.WithCancel(ctx)
	// The cores' business per half second, as the timeline counts.
	busyDone := make(chan busySteps, 1)
	go func() { busyDone <- sampleBusy(cctx, windowEnd, windowStart, timelineStep) }()
	go func() {
		defer close(costs)
		if sleepCtx(cctx, time.Until(windowStart)) {
			atWindow = readRedisCost(cctx, b.rdb)
		}
		if sleepCtx(cctx, time.Until(windowStart.Add(b.grace))) {
			if stormReleaseProfile != "" && stormProfile == "" {
				stop, err := startProfile(stormReleaseProfile)
				if err != nil {
					fmt.Fprintf(os.Stderr, "detectbench: storm release profile: %v\n", err)
				} else {
					stopReleaseProfile = stop
				}
			}
			if stormSlowlog {
				if err := startSlowlog(cctx, b.rdb); err != nil {
					fmt.Fprintf(os.Stderr, "detectbench: slowlog: %v\n", err)
				}
			}
			cpuAtRelease = readCPUUse()
			atRelease = readRedisCost(cctx, b.rdb)
		}
	}()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if hook.distinct() >= n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	atEnd := readRedisCost(ctx, b.rdb)
	cpuAtEnd := readCPUUse()
	cancelCosts()
	<-costs
	busy := <-busyDone
	stopReleaseProfile()
	distinct, resent, doubled, lastAt := hook.summary()
	res.Delivered = distinct
	res.Lost = n - distinct
	res.Resent = resent
	res.Doubled = doubled
	res.AllDeliveredMS = float64(lastAt.Sub(windowEnd).Milliseconds())
	res.WaitedMS = float64(wait.Milliseconds())
	// A held timeout is released a grace after its deadline (or at
	// once, if found later than that), so none arrives before the
	// window's start plus the grace.
	res.AtOnce = hook.arrivedBefore(windowStart.Add(b.grace))
	for rule, v := range held() {
		if d := v - held0[rule]; rule == "mass-expiry" {
			res.Held += d
		} else {
			res.HeldOther += d
		}
	}
	if atWindow.calls != nil {
		whole := atEnd.since(atWindow)
		res.RedisCPUS = whole.cpuS
		calls, _ := whole.total()
		res.RedisCallsPerTimeout = float64(calls) / float64(n)
		whole.print(os.Stderr, "storm, from the window's start", n)
	}
	if atRelease.calls != nil {
		rel := atEnd.since(atRelease)
		res.RedisReleaseCPUS = rel.cpuS
		calls, _ := rel.total()
		res.RedisReleaseCallsPerTimeout = float64(calls) / float64(max(res.Held, 1))
		rel.print(os.Stderr, "storm, from the first release (per held timeout)", res.Held)
		res.ReleaseMS = float64(lastAt.Sub(windowStart.Add(b.grace)).Milliseconds())
		self, machineBusy := cpuAtEnd.since(cpuAtRelease)
		res.ReleaseSelfCPUS, res.ReleaseMachineBusy, res.Cores = self.Seconds(), machineBusy, runtime.NumCPU()
		if median, peak, ok := busy.over(windowStart.Add(b.grace), lastAt); ok {
			res.ReleaseBusyMedian, res.ReleaseBusyPeak = median, peak
		}
		fmt.Fprintf(os.Stderr, "detectbench: storm, from the first release to the last guide (%.0f ms): this process %.2f CPU s, Redis %.2f CPU s, the machine's %d cores %.0f%% busy (per half second: median %.0f%%, peak %.0f%%)\n",
			res.ReleaseMS, res.ReleaseSelfCPUS, res.RedisReleaseCPUS, res.Cores, 100*machineBusy, 100*res.ReleaseBusyMedian, 100*res.ReleaseBusyPeak)
	}
	if stormSlowlog && atRelease.calls != nil {
		stopSlowlog(ctx, b.rdb, os.Stderr, res.Held)
	}
	b.timeline(ctx, topic, windowEnd, hook.firstArrivals(), busy)
	return res, nil
}

// stormProfile names the file of the storm's CPU profile; "" for none.
// stormReleaseProfile likewise, of its release alone (from the first
// release to the last guide); not taken beside stormProfile, as one CPU
// profile runs at a time.
var stormProfile, stormReleaseProfile string

// startProfile starts a CPU profile of this process into path, whose
// stop ends it; nothing when path is "".
func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// timelineStep is the timeline's step.
const timelineStep = 500 * time.Millisecond

// timeline prints, per half second from the window's end, how many storm
// events were produced (their records' timestamps), how many guides
// first arrived, and how busy the machine's cores were: where the
// storm's time goes, the listener or the consumer, and whether the cores
// bound it.
func (b *bench) timeline(ctx context.Context, topic string, from time.Time, arrivals []time.Time, busy busySteps) {
	const step = timelineStep
	bucket := busySteps{from: from, step: step}.index
	produced, guided := map[int]int{}, map[int]int{}
	for _, at := range arrivals {
		guided[bucket(at)]++
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	n := 0
	for n < len(arrivals) && rctx.Err() == nil {
		cl.PollFetches(rctx).EachRecord(func(r *kgo.Record) {
			produced[bucket(r.Timestamp)]++
			n++
		})
	}
	lo, hi := 0, 0
	for _, m := range []map[int]int{produced, guided} {
		for k := range m {
			lo, hi = min(lo, k), max(hi, k)
		}
	}
	fmt.Fprintf(os.Stderr, "detectbench: storm timeline from the window's end (s: produced / guided, cores busy)\n")
	for k := lo; k <= hi; k++ {
		if produced[k] == 0 && guided[k] == 0 {
			continue
		}
		cores := "    -"
		if v, ok := busy.busy[k]; ok {
			cores = fmt.Sprintf("%4.0f%%", 100*v)
		}
		fmt.Fprintf(os.Stderr, "  %+5.1f  %6d / %6d  %s\n", float64(k)*step.Seconds(), produced[k], guided[k], cores)
	}
}
