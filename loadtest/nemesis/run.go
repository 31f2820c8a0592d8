package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/promise"
)

// Timing of a run around its schedule.
const (
	// readyWithinUsers bounds the users' first answered signals.
	readyWithinUsers = 60 * time.Second
	// lostMargin is how long the history goes on past the End it gives
	// the checker: a stage due then may come late and be seen late, not
	// taken for lost; one whose bound is past End is pending.
	lostMargin = 10 * time.Second
)

// result is what a run found.
type result struct {
	s        settings
	started  time.Time
	start    time.Time // the schedule's
	history  promise.History
	took     time.Duration
	plan     []planned
	outcomes []outcome
	verdicts []promise.Verdict
	rows     []promise.Row
	totals   map[string]float64
	missed   []string
	signals  int
	guides   int
	repeats  int // guides a device saw again, by id
	crashes  int64
	harness  []string
	logs     string // where the services' logs are, when kept
	excused  int    // lost stages the users' timelines showed late, then cancelled when the user came back
	cfg      promise.Config
}

// checkConfig is what the stack promises this run.
func checkConfig(s settings) promise.Config {
	return promise.Config{
		// Detection (a sweep every 200 ms), produce, fetch and push on a
		// loaded two-core machine.
		Slack:    2 * time.Second,
		InFlight: 500 * time.Millisecond,
		Stale:    time.Second,
		Grace:    checkGrace(s),
		Match:    time.Second,
		Delays:   []time.Duration{s.closeAfter},
		Window:   time.Minute,
	}
}

// checkGrace is how long past a fault's end the checker lets the stages
// it met wait more: the listeners' outage grace, and a margin for
// detection, produce and push on a loaded machine. Every fault's window
// has it (a consumer's more: graceOf).
func checkGrace(s settings) time.Duration { return s.grace + 3*time.Second }

func run(ctx context.Context, s settings) (*result, error) {
	res := &result{s: s, started: time.Now(), cfg: checkConfig(s)}
	r, err := startRig(ctx, s)
	if err != nil {
		return nil, err
	}
	defer r.close()
	if s.keepLogs {
		res.logs = r.dir + "/logs"
		fmt.Fprintf(os.Stderr, "nemesis: the services' logs are in %s\n", res.logs)
	}
	rec := &recorder{}
	ws := s.users * 3 / 5
	c, err := newCrowd(r, rec, s.seed, ws, s.users-ws, ws/3)
	if err != nil {
		return nil, err
	}
	r.crowd = c
	devCtx, stopDevices := context.WithCancel(ctx)
	defer func() { stopDevices(); c.wait() }()
	t0 := time.Now()
	drvCtx, stopDrivers := context.WithCancel(ctx)
	defer stopDrivers()
	calm := make(chan struct{})
	c.start(drvCtx, devCtx, calm)
	for deadline := time.Now().Add(readyWithinUsers); c.ready() < len(c.users); {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("only %d of %d users had a first signal answered within %v", c.ready(), len(c.users), readyWithinUsers)
		}
		sleepCtx(ctx, 100*time.Millisecond) // a poll of the users' state
	}
	fmt.Fprintf(os.Stderr, "nemesis: %d users up in %v\n", len(c.users), time.Since(t0).Round(time.Millisecond))

	cov := newCoverage()
	covCtx, stopCov := context.WithCancel(ctx)
	var covDone sync.WaitGroup
	covDone.Go(func() { cov.run(covCtx, r) })
	defer func() { stopCov(); covDone.Wait() }()
	joins0 := r.joins.Load()

	res.plan = schedule(s.seed, s.duration, s.kinds)
	start := time.Now()
	res.start = start
	outcomes := make([]outcome, len(res.plan))
	var faults sync.WaitGroup
	for i, p := range res.plan {
		faults.Go(func() {
			if !sleepCtx(ctx, time.Until(start.Add(p.At))) {
				outcomes[i] = outcome{planned: p, Err: ctx.Err()}
				return
			}
			fmt.Fprintf(os.Stderr, "nemesis: %s\n", p)
			outcomes[i] = r.runFault(ctx, p, rec)
			if err := outcomes[i].Err; err != nil {
				fmt.Fprintf(os.Stderr, "nemesis: %s: %v\n", p.Kind, err)
			}
		})
	}
	faults.Wait()
	res.outcomes = outcomes
	// The users go on until the schedule's length has passed and the
	// last fault healed, then stay present: the silences begun before
	// come due, are delivered (or deferred to their minute's end), and
	// are judged.
	sleepCtx(ctx, time.Until(start.Add(s.duration)))
	close(calm)
	end := settleUntil(time.Now(), s, res.cfg, r.graceOf("consumer"))
	fmt.Fprintf(os.Stderr, "nemesis: schedule done; settling for %v\n", time.Until(end).Round(time.Second))
	sleepCtx(ctx, time.Until(end)) // real time: the last stages come due
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	end = time.Now()
	stopDrivers()
	cov.scrape(ctx, r)
	stopCov()
	covDone.Wait()
	stopDevices()
	c.wait()

	res.totals = cov.totals()
	res.totals[rebalancePath] = float64(r.joins.Load() - joins0)
	res.missed = missed(res.totals)
	h := rec.history(end.Add(-lostMargin))
	res.signals, res.guides = len(h.Signals), len(h.Deliveries)
	res.repeats = repeats(h.Deliveries)
	res.history = h
	res.verdicts = promise.Check(res.cfg, h)
	res.excused = r.excuseLate(ctx, res.verdicts, h, res.cfg)
	res.rows = promise.Table(res.verdicts)
	if s.keepLogs {
		var uids []string
		for _, v := range res.failures() {
			if !slices.Contains(uids, v.UID) {
				uids = append(uids, v.UID)
			}
		}
		r.saveTimelines(ctx, uids)
	}
	res.crashes = r.exits.Load()
	res.harness = slices.Clone(rec.harness)
	res.took = time.Since(res.started)
	return res, nil
}

// repeats counts the deliveries of an id a sink had seen already: the
// protocol allows them (a client shows a guide once per id), the report
// counts them.
func repeats(ds []promise.Delivery) int {
	seen := map[[2]string]bool{}
	n := 0
	for _, d := range ds {
		k := [2]string{d.Sink, d.ID}
		if seen[k] {
			n++
		}
		seen[k] = true
	}
	return n
}

// settleUntil is when a run whose users stayed present from calm on may
// stop recording: the last silence begun before calm (its deadline a TTL
// and the longest hold after) has had its stages, each by the grace of a
// fault and, when deferred by the minute rule, by its window's end; and
// lostMargin more.
func settleUntil(calm time.Time, s settings, cfg promise.Config, grace time.Duration) time.Time {
	last := calm.Add(3*s.ttl + s.closeAfter)
	end := last.Add(grace + cfg.Slack)
	if w := cfg.Window; w > 0 {
		windowEnd := last.Truncate(w).Add(w)
		end = later(end, windowEnd.Add(s.closeAfter+cfg.Slack+5*time.Second))
	}
	return end.Add(lostMargin)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// excuseLate reclassifies, in place, each lost stage whose user's
// timeline shows it still in the stack when the user came back
// (cancelledLate), and counts them. A timeline that cannot be read
// leaves its stages lost.
func (r *rig) excuseLate(ctx context.Context, vs []promise.Verdict, h promise.History, cfg promise.Config) int {
	timelines := map[string][]tlEntry{}
	n := 0
	for i, v := range vs {
		if v.Class != promise.Lost {
			continue
		}
		es, ok := timelines[v.UID]
		if !ok {
			var err error
			if es, err = r.timelineOf(ctx, v.UID); err != nil {
				fmt.Fprintln(os.Stderr, "nemesis:", err)
			}
			timelines[v.UID] = es
		}
		if nv, ok := cancelledLate(v, h, es, cfg); ok {
			vs[i] = nv
			n++
		}
	}
	return n
}
