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
			fmt.Sprintf("**%.1f ms** (%.1f) vs %.1f ms (%.1f)", e.Pong.PongP99ms, e.Pong.PongP50ms, g.Pong.PongP99ms, g.Pong.PongP50ms),
			"no worse than goroutine mode's", judge(e.Pong.PongN > 0 && e.Pong.PongP99ms <= g.Pong.PongP99ms)},
		{"Redis round trips per renewal: epoll vs goroutine",
			fmt.Sprintf("**%.4f** vs %.4f", e.TripsPerRen, g.TripsPerRen),
			"no worse than goroutine mode's", judge(e.Renewals > 0 && e.TripsPerRen <= g.TripsPerRen)},
	}
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
