package main

import "fmt"

// timelineRows are step 3c: what users' timelines cost, in Redis and in
// guide latency (hybrid with the timeline on, in step 3's run, against
// hybrid with it off, run right after).
func timelineRows(d *Detection, row func(step, fig, val, goal, st, cmd string)) {
	if t := d.Timeline; t != nil && t.Silences > 0 {
		row("3c", fmt.Sprintf("timeline in Redis after %d silences (two stages each)", t.Silences),
			fmt.Sprintf("**%.0f bytes** and %.1f entries per silence; %d timelines, at most %d entries in one", t.PerSilenceB, t.EntriesPer, t.Users, t.MaxEntries),
			"", "", d.Command)
	}
	if t := d.StormTimeline; t != nil && d.Storm != nil {
		row("3c", fmt.Sprintf("timeline in Redis after the storm (%d more silences)", d.Storm.Sessions),
			fmt.Sprintf("%.0f MB in all, %.0f bytes per silence; at most %d entries in one timeline", float64(t.MemoryBytes)/(1<<20), t.PerSilenceB, t.MaxEntries),
			"at most the timeline-entries setting per user", statusPlain(t.MaxEntries <= 100), d.Command)
	}
	off := d.TimelineOff
	if off == nil {
		return
	}
	var on, wo *DetectMode
	for i := range d.Modes {
		if d.Modes[i].Mode == "hybrid" {
			on = &d.Modes[i]
		}
	}
	for i := range off.Modes {
		if off.Modes[i].Mode == "hybrid" {
			wo = &off.Modes[i]
		}
	}
	if on == nil || wo == nil || wo.GuideP99ms <= 0 {
		return
	}
	ratio := on.GuideP99ms / wo.GuideP99ms
	row("3c", "guide latency, hybrid, timeline on vs off (p50 / p99)",
		fmt.Sprintf("%.0f / **%.0f** ms vs %.0f / %.0f ms (p99 %.0f%%)", on.GuideP50ms, on.GuideP99ms, wo.GuideP50ms, wo.GuideP99ms, 100*ratio),
		"within 5% of off (or 2 ms, the run's noise)", statusPlain(on.GuideP99ms <= wo.GuideP99ms*1.05 || on.GuideP99ms-wo.GuideP99ms <= 2), off.Command)
}

func statusPlain(met bool) string {
	if met {
		return "met"
	}
	return "**missed**"
}
