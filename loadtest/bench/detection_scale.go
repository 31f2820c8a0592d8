package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Step 3b: detection at a million live sessions. The prefetch path (mode
// sweep, the listener's default) against the sweep alone every 200 ms
// (sweep-noprefetch, as before it), each with one and two listener
// replicas sharing the work: guide latency past the deadline, and what
// detection costs Redis (its calls per second, INFO commandstats). No
// storm: at this size the mass-expiry brake's share is 100,000 lapses,
// and step 4 measures the brake.

// goalScaleP99ms is the goal: guides at most 25 ms past the
// deadline (p99) at a million live sessions.
const goalScaleP99ms = 25

func detectionAtScale(ctx context.Context, bin string, sc detectScale) (*Detection, error) {
	args := []string{"-live", strconv.Itoa(sc.Live), "-silent", strconv.Itoa(sc.Silent),
		"-modes", "sweep-noprefetch,sweep", "-replicas", "1,2", "-storm", "0"}
	if sc.Window > 0 {
		args = append(args, "-window", sc.Window.String())
	}
	if sc.Wait > 0 {
		args = append(args, "-wait", sc.Wait.String())
	}
	if sc.Grace > 0 {
		args = append(args, "-grace", sc.Grace.String())
	}
	d := &Detection{}
	fmt.Printf("detection at scale: %d live, %d silent, one and two replicas\n", sc.Live, sc.Silent)
	err := runJSON(ctx, sc.Limit, d, bin, "detectbench", args...)
	d.Command = commandLine("detectbench", args...)
	return d, err
}

// scaleRows are step 3b's summary rows.
func (r *Report) scaleRows(d *Detection, row func(step, fig, val, goal, st, cmd string)) {
	for _, m := range d.Modes {
		goal, st := "", ""
		if m.Mode == "sweep" {
			goal, st = "p99 at most 25 ms", r.status(m.GuideP99ms <= goalScaleP99ms, true)
		}
		row("3b", fmt.Sprintf("guide latency past the deadline at %d live, %s, %d replica(s) (p50 / p99 / max); Redis script calls/s idle, expiring", d.Live, m.Mode, m.Replicas),
			fmt.Sprintf("%.0f / **%.0f** / %.0f ms, %d lost, %d doubled; %.0f, %.0f script calls/s", m.GuideP50ms, m.GuideP99ms, m.GuideMaxms,
				max(m.Lost, m.Silent-m.Guided), m.GuidesDoubled, m.IdleScriptsPerS, m.ExpiryScriptsPerS), goal, st, d.Command)
	}
}

// scaleMD is step 3b's section.
func (r *Report) scaleMD(b *strings.Builder, d *Detection) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("\n## 3b. Detection at %d live sessions, one and two replicas\n\n`%s`\n\n", d.Live, d.Command)
	p("%d live sessions (written in %.1f s through pipelined renewals; Redis then used %.0f MB), %d more going silent per run over 10 s. *sweep* is the listener's default: each replica owns a share of the 64 buckets, reads ahead what falls due within the next second every 500 ms, sets a local timer per deadline and confirms it in Redis when it fires (10 ms slots), with a safety sweep of all buckets every 5 s. *sweep-noprefetch* is the sweep alone, every replica sweeping every bucket every 200 ms. Redis figures are INFO commandstats deltas per second, script calls (EVALSHA, EVAL) and all commands (those the scripts run included): *idle* over 5 s with the listeners running and nothing due (their detection cost, and the idle guide consumer's); *expiring* from the first silent deadline to the last (detection, dedup, settling, the close stages' scheduling and the consumer's guides).\n\n",
		d.Live, d.LiveWriteS, d.RedisMemoryMB, d.Silent)
	p("| mode | replicas | events | lost | duplicate events | held | event lag p50 / p99 / max | guides | doubled | guide latency p50 / p99 / max | close stage guide latency p50 / p99 / max | script calls/s idle, expiring | commands/s idle, expiring |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range d.Modes {
		p("| %s | %d | %d | %d | %d | %d | %.0f / %.0f / %.0f ms | %d | %d | %.0f / **%.0f** / %.0f ms | %.0f / %.0f / %.0f ms | %.0f, %.0f | %.0f, %.0f |\n",
			m.Mode, m.Replicas, m.Produced, m.Lost, m.Duplicates, m.Held, m.LagP50ms, m.LagP99ms, m.LagMaxms, m.Guided, m.GuidesDoubled,
			m.GuideP50ms, m.GuideP99ms, m.GuideMaxms, m.CloseGuideP50, m.CloseGuideP99, m.CloseGuideMax,
			m.IdleScriptsPerS, m.ExpiryScriptsPerS, m.IdleCallsPerS, m.ExpiryCallsPerS)
	}
}
