package main

import (
	"fmt"
	"strings"
)

// goalCPUPerPingRatio: epoll mode may spend at most this share of
// goroutine mode's gateway CPU per ping.
const goalCPUPerPingRatio = 1.15

// modeGoal is one of the side-by-side step's goals: epoll mode's figure
// against goroutine mode's.
type modeGoal struct {
	figure, measured, goal, status string
}

// modesGoals are the side-by-side step's rows of the summary.
func (r *Report) modesGoals(m *Modes) []modeGoal {
	e, g := m.mode("epoll"), m.mode("goroutine")
	if e == nil || g == nil {
		return nil
	}
	judge := func(met bool) string {
		if !m.Supported {
			return "n/a (the gateway has no read mode setting: both read with goroutines)"
		}
		return r.status(met, false)
	}
	p99Parts := pairParts(e, g, func(p pongFigures, _ float64) float64 { return p.PongP99ms })
	tripParts := pairParts(e, g, func(_ pongFigures, trips float64) float64 { return trips })
	ratio := 0.0
	if g.CPUmsPer1000 > 0 {
		ratio = e.CPUmsPer1000 / g.CPUmsPer1000
	}
	return []modeGoal{
		{"gateway RSS per connection, idle / pinging: epoll vs goroutine",
			fmt.Sprintf("**%.2f / %.2f KB** vs %.2f / %.2f KB", e.IdleRSSPerConn, e.RSSPerConn, g.IdleRSSPerConn, g.RSSPerConn), "", ""},
		{"gateway CPU per 1,000 pings: epoll vs goroutine",
			fmt.Sprintf("**%.0f ms** vs %.0f ms (%.0f%%)", e.CPUmsPer1000, g.CPUmsPer1000, 100*ratio),
			"at most 115% of goroutine mode's", judge(g.CPUmsPer1000 > 0 && ratio <= goalCPUPerPingRatio)},
		{"ping→pong p99 (p50): epoll vs goroutine",
			fmt.Sprintf("**%.1f ms** (%.1f) vs %.1f ms (%.1f)%s", e.Pong.PongP99ms, e.Pong.PongP50ms, g.Pong.PongP99ms, g.Pong.PongP50ms, p99Parts.String()),
			noWorse, judge(e.Pong.PongN > 0 && p99Parts.noWorse())},
		{"Redis round trips per renewal: epoll vs goroutine",
			fmt.Sprintf("**%.4f** vs %.4f%s", e.TripsPerRen, g.TripsPerRen, tripParts.String()),
			noWorse, judge(e.Renewals > 0 && tripParts.noWorse())},
	}
}

// noWorse is the goal of the figures compared part by part.
const noWorse = "no worse than goroutine mode's: over the whole window, or in most of its parts"

// pairedParts is one figure of two modes, over the whole window and over
// each of its parts (taken at the same moments for both): lower is
// better.
type pairedParts struct {
	whole [2]float64   // new mode, old mode
	parts [][2]float64 // the same, part by part
}

func pairParts(e, g *ModeResult, f func(pongFigures, float64) float64) pairedParts {
	pp := pairedParts{whole: [2]float64{f(e.Pong, e.TripsPerRen), f(g.Pong, g.TripsPerRen)}}
	for i := range min(len(e.Parts), len(g.Parts)) {
		pp.parts = append(pp.parts, [2]float64{f(e.Parts[i].Pong, e.Parts[i].TripsPerRen), f(g.Parts[i].Pong, g.Parts[i].TripsPerRen)})
	}
	return pp
}

// better counts the parts in which the new mode was no worse.
func (pp pairedParts) better() int {
	n := 0
	for _, p := range pp.parts {
		if p[0] <= p[1] {
			n++
		}
	}
	return n
}

// noWorse: the new mode was no worse over the whole window, or in most
// of its parts. Both gateways share the machine, so a part in which
// one of them met a collection or a scheduling hiccup moves the whole
// window's figure; most of the paired parts agreeing is the
// comparison this machine's noise allows.
func (pp pairedParts) noWorse() bool {
	return pp.whole[0] <= pp.whole[1] || 2*pp.better() > len(pp.parts)
}

func (pp pairedParts) String() string {
	if len(pp.parts) == 0 {
		return ""
	}
	return fmt.Sprintf("; no worse in %d of %d parts", pp.better(), len(pp.parts))
}

func (r *Report) modesMD(b *strings.Builder, m *Modes) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("\n## 7. Read modes side by side\n\n`%s`\n\n", m.Command)
	if !m.Supported {
		p("**The gateway built here has no read mode setting** (`%s`): both gateways read with a goroutine per connection, so the columns differ by noise only.\n\n", readModeEnv)
	}
	p("One gateway per read mode (`%s`), both on one redis-server, each held by a wsload process of its own with %d connections, so both share the machine alike. Idle figures are taken %.0f s after every connection was up, before any pinged; then every connection pings every %s, and the rest is measured over %.0f s once each had pinged. Per connection figures are of what the load added to the gateway idle before it.\n\n",
		readModeEnv, m.Conns, m.IdleSec, m.PingEvery, m.WindowSec)
	if !m.IdleClean {
		p("*Some connections had begun pinging when the idle figures were taken: this machine was slower than the idle hold allows.*\n\n")
	}
	p("| | %s |\n|---|%s\n", strings.Join(modeNames(m), " | "), strings.Repeat("---|", len(m.Modes)))
	row := func(name string, f func(*ModeResult) string) {
		var cells []string
		for i := range m.Modes {
			cells = append(cells, f(&m.Modes[i]))
		}
		p("| %s | %s |\n", name, strings.Join(cells, " | "))
	}
	kb := func(v float64) string { return fmt.Sprintf("%.2f KB", v) }
	row("connections held", func(x *ModeResult) string {
		return fmt.Sprintf("%.0f (wsload: %d connected, %d failed, %d dropped, %d closed by the gateway)", x.Conns, x.Load.Conns, x.Load.Failed, x.Load.Dropped, x.Load.Closed)
	})
	row("**RSS per connection, idle**", func(x *ModeResult) string { return "**" + kb(x.IdleRSSPerConn) + "**" })
	row("of which Go heap in use / stacks / rest, idle", func(x *ModeResult) string {
		return fmt.Sprintf("%.2f / %.2f / %.2f KB", x.IdleHeap, x.IdleStack, x.IdleOther)
	})
	row("goroutines, idle", func(x *ModeResult) string { return fmt.Sprintf("%.0f", x.IdleGoroutines) })
	row("**RSS per connection, pinging**", func(x *ModeResult) string { return "**" + kb(x.RSSPerConn) + "**" })
	row("of which Go heap in use / stacks / rest, pinging", func(x *ModeResult) string {
		return fmt.Sprintf("%.2f / %.2f / %.2f KB", x.HeapPerConn, x.StackPerConn, x.OtherPerConn)
	})
	row("goroutines, pinging", func(x *ModeResult) string { return fmt.Sprintf("%.0f", x.Goroutines) })
	row("gateway CPU", func(x *ModeResult) string {
		return fmt.Sprintf("%.2f cores for %.0f pings/s", x.CPUCores, x.Pings/m.WindowSec)
	})
	row("**gateway CPU per 1,000 pings**", func(x *ModeResult) string { return fmt.Sprintf("**%.0f ms**", x.CPUmsPer1000) })
	row("ping→pong p50 / **p99** / p99.9 / max", func(x *ModeResult) string {
		return fmt.Sprintf("%.1f / **%.1f** / %.1f / %.1f ms (%d pongs)", x.Pong.PongP50ms, x.Pong.PongP99ms, x.Pong.PongP999ms, x.Pong.PongMaxms, x.Pong.PongN)
	})
	row("renewals per Redis round trip", func(x *ModeResult) string {
		return fmt.Sprintf("%.1f (%.0f renewals in %.0f round trips; %.4f round trips per renewal)", x.RenPerTrip, x.Renewals, x.RoundTrips, x.TripsPerRen)
	})
	row("renewal round trip, mean", func(x *ModeResult) string { return fmt.Sprintf("%.3f ms", x.FlushMs) })
	row("a renewal's wait for its round trip, mean (ping to reply, less the round trip)", func(x *ModeResult) string {
		if x.RenewalMs <= 0 {
			return "not measured"
		}
		return fmt.Sprintf("%.3f ms (%.3f ms ping to reply)", x.RenewalMs-x.FlushMs, x.RenewalMs)
	})
	if goals := r.modesGoals(m); len(goals) > 0 {
		p("\n| goal | measured | goal | |\n|---|---|---|---|\n")
		for _, g := range goals[1:] {
			p("| %s | %s | %s | %s |\n", g.figure, g.measured, g.goal, g.status)
		}
	}
	for _, x := range m.Modes {
		if x.HeapTop != "" {
			p("\n**Heap profile of %s** (%s mode, pinging; `go tool pprof -top -sample_index=inuse_space`):\n\n```\n%s\n```\n", x.Gateway, x.Mode, x.HeapTop)
		}
	}
	if len(m.GatewayLogs) > 0 {
		p("\nGateway log lines during the step: %s.\n", strings.Join(m.GatewayLogs, "; "))
	}
}

func modeNames(m *Modes) []string {
	var out []string
	for _, x := range m.Modes {
		out = append(out, x.Mode+" ("+x.Gateway+")")
	}
	return out
}
