package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/redisserver"
)

func secret() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// run runs the chosen steps and writes the report. failed means a step
// failed or a guide was lost or doubled; err that no report was written.
func run(ctx context.Context, bin, out string, quick bool, stepList string, over connOverride) (failed bool, err error) {
	steps := config.SplitList(stepList)
	for _, s := range steps {
		if !slices.Contains(allSteps, s) {
			return false, fmt.Errorf("-steps: unknown step %q (want some of %s)", s, strings.Join(allSteps, ","))
		}
	}
	sc := scaleFor(quick)
	connFlags := over.apply(&sc.conns)
	rep := &Report{Quick: quick, Started: time.Now().UTC().Truncate(time.Second), Machine: machine(),
		Command: "make bench", Steps: steps, Errors: map[string]string{}}
	if quick {
		rep.Command = "make bench QUICK=1"
	}
	if len(steps) != len(allSteps) {
		rep.Command = "bin/bench -steps " + strings.Join(steps, ",")
		if quick {
			rep.Command += " -quick"
		}
	}
	for _, s := range allSteps {
		if !slices.Contains(steps, s) {
			rep.Skipped = append(rep.Skipped, s+": not among -steps")
		}
	}
	start := time.Now()
	stepCmd := func(step string) string {
		c := "bin/bench -steps " + step
		if quick {
			c += " -quick"
		}
		return c
	}
	fail := func(step string, err error) {
		if err != nil {
			rep.Errors[step] = err.Error()
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", step, err)
		}
	}

	if slices.ContainsFunc(steps, func(s string) bool { return slices.Contains([]string{"connections", "held", "renewals", "modes"}, s) }) {
		dir, err := os.MkdirTemp("", "stillthere-bench-")
		if err != nil {
			return false, err
		}
		defer os.RemoveAll(dir)
		// Above the many gateways and load generators beside it, as a
		// production Redis has cores of its own (see redisNice).
		rds, err := redisserver.Start(ctx, redisserver.Options{Dir: dir, Args: []string{"--maxclients", "50000"}, Nice: redisNice})
		if err != nil {
			return false, fmt.Errorf("redis-server: %w", err)
		}
		defer rds.Close()
		rdb := redis.NewClient(&redis.Options{Addr: rds.Addr})
		defer rdb.Close()
		rep.Machine.RedisNice = redisProcessNice(ctx, rdb)
		s := secrets{token: secret(), push: secret()}
		if slices.Contains(steps, "connections") && ctx.Err() == nil {
			rep.Connections, err = connections(ctx, bin, rds.Addr, rdb, s, sc.conns, stepCmd("connections")+connFlags)
			fail("connections", err)
		}
		if slices.Contains(steps, "held") && ctx.Err() == nil {
			rep.Held, err = connections(ctx, bin, rds.Addr, rdb, s, sc.held, stepCmd("held"))
			fail("held", err)
		}
		if slices.Contains(steps, "renewals") && ctx.Err() == nil {
			rep.Renewals, err = renewals(ctx, bin, rds.Addr, rdb, s, sc.renew, stepCmd("renewals"))
			fail("renewals", err)
		}
		if slices.Contains(steps, "modes") && ctx.Err() == nil {
			rep.Modes, err = modes(ctx, bin, rds.Addr, s, sc.modes, stepCmd("modes"))
			fail("modes", err)
		}
	}
	if slices.Contains(steps, "detection") && ctx.Err() == nil {
		if available(bin, "detectbench") {
			rep.Detection, err = detection(ctx, bin, sc.detect)
			fail("detection", err)
			if ctx.Err() == nil {
				rep.DetectionAtScale, err = detectionAtScale(ctx, bin, sc.scale)
				fail("detection at scale", err)
			}
		} else {
			rep.Skipped = append(rep.Skipped, "detection: detectbench is not built (loadtest/detectbench)")
		}
	}
	if slices.Contains(steps, "consumer") && ctx.Err() == nil {
		rep.Consumer, err = consumer(ctx, bin, sc.consumer)
		fail("consumer", err)
	}
	if slices.Contains(steps, "activity") && ctx.Err() == nil {
		if available(bin, "activitybench") {
			rep.Activity, err = activityStep(ctx, bin, sc.activity)
			fail("activity", err)
		} else {
			rep.Skipped = append(rep.Skipped, "activity: activitybench is not built (loadtest/activitybench)")
		}
	}
	if slices.Contains(steps, "outage") && ctx.Err() == nil {
		if available(bin, "outagebench") {
			rep.Outage, err = outage(ctx, bin, sc.outage)
			fail("outage", err)
		} else {
			rep.Skipped = append(rep.Skipped, "outage: outagebench is not built (loadtest/outagebench)")
		}
	}
	if ctx.Err() != nil {
		// A partial run must not replace the last report.
		return true, fmt.Errorf("interrupted; no report written")
	}
	rep.DurationSec = time.Since(start).Round(time.Second).Seconds()
	rep.judge()
	if err := rep.write(out); err != nil {
		return true, err
	}
	return !rep.Passed, nil
}
