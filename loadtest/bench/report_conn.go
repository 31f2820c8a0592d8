package main

import (
	"fmt"
	"strconv"
	"strings"
)

// goalRow is a row of the summary: a figure, and its goal if it has one
// (atScale: judged only at full scale).
type goalRow struct {
	figure, measured, goal string
	met, atScale           bool
}

// summary are step 1's rows of the summary.
func (c *Connections) summary() []goalRow {
	l := c.Load
	rss := fmt.Sprintf("**%.2f KB** at %.0f connections", c.RSSPerConnKB, c.Held)
	if c.Held < float64(c.Target)/2 {
		// What is left is mostly the gateways' own memory.
		rss = fmt.Sprintf("not measured: %.0f of %d connections held (see the gateway log lines)", c.Held, c.Target)
	}
	held := goalRow{figure: "sessions held at " + c.PingEvery + " pings" + c.settings(),
		measured: fmt.Sprintf("**%.0f** of %d, %d gateways; %d failed, %d dropped, %d closed by a gateway", c.Held, c.Target, c.Gateways, l.Failed, l.Dropped, l.Closed)}
	if c.Step != "1" || c.Target >= goalConns {
		// Step 1 holds the RSS goal's 100,000 at 15 s pings; the held
		// goal is step 1b's, unless step 1 was set to it.
		held.goal = thousands(goalConns) + ", load generator included; none failed or dropped"
		held.met, held.atScale = c.Held >= goalConns && l.Failed == 0 && l.Dropped == 0 && l.Closed == 0, true
	}
	mem := goalRow{figure: fmt.Sprintf("gateway RSS per connection, %s mode", c.ReadMode), measured: rss}
	if c.Step == "1" {
		// The goal's conditions: connections pinging every 15 s.
		mem.goal = fmt.Sprintf("at most %d KB in epoll mode, at %s connections or more", goalRSSPerConnKB, thousands(goalRSSConns))
		mem.met, mem.atScale = c.ReadMode == "epoll" && c.Held >= goalRSSConns && c.RSSPerConnKB <= goalRSSPerConnKB, true
	}
	return []goalRow{
		held,
		mem,
		{figure: "gateway CPU", measured: fmt.Sprintf("%.2f cores in all (%.0f renewals/s)", c.GatewayCPU, c.Renewals)},
		{figure: "ping→pong p50 / p99 / p99.9, at the load generator",
			measured: fmt.Sprintf("%.1f / **%.1f** / %.1f ms (%d pongs)", c.Pong.PongP50ms, c.Pong.PongP99ms, c.Pong.PongP999ms, c.Pong.PongN)},
	}
}

// settings says the gateways' session TTL and idle timeout when the step
// set them.
func (c *Connections) settings() string {
	switch {
	case c.SessionTTL != "" && c.IdleTimeout != "":
		return fmt.Sprintf(" (session TTL %s, idle timeout %s)", c.SessionTTL, c.IdleTimeout)
	case c.SessionTTL != "":
		return fmt.Sprintf(" (session TTL %s)", c.SessionTTL)
	case c.IdleTimeout != "":
		return fmt.Sprintf(" (idle timeout %s)", c.IdleTimeout)
	}
	return ""
}

// cpuPerPing is the CPU a ping cost in all (gateways, wsloads, Redis), in
// µs, over the step's window; 0 when nothing was measured.
func (c *Connections) cpuPerPing() float64 {
	if c == nil || c.Renewals <= 0 {
		return 0
	}
	return (c.GatewayCPU + c.LoadCPU + c.RedisCPU) / c.Renewals * 1e6
}

func (r *Report) connectionsMD(b *strings.Builder, c *Connections) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	if c.Step == "1" {
		p("\n## 1. Connections\n\n`%s`\n\n", c.Command)
	} else {
		p("\n## %s. Connections held\n\n`%s`\n\n", c.Step, c.Command)
	}
	held := float64(c.Load.Conns - c.Load.Dropped - c.Load.Closed)
	p("%d connections aimed at %d gateway processes in %s read mode (each its own ports and instance id, all on one redis-server) from %d wsload processes, each pinging every %s%s; measured over %.0f s once every connection was up and had pinged.\n\n",
		c.Target, c.Gateways, c.ReadMode, c.Loaders, c.PingEvery, c.settings(), c.WindowSec)
	switch {
	case c.Step == "1" && c.Target < goalConns:
		p("The RSS goal's conditions: %s connections or more, pinging every 15 s. The held goal's %s connections are step 1b's, at a slower cadence.\n\n",
			thousands(goalRSSConns), thousands(goalConns))
	case c.Step != "1":
		p("Why not at 15 s pings: everything runs on this machine's %d cores, the load generator included, and every ping costs CPU in the wsload that sends it, the gateway, and Redis.", r.Machine.Cores)
		if us := r.Connections.cpuPerPing(); us > 0 {
			p(" Step 1 of this run measured %.0f µs of CPU per ping in all, so %s connections pinging every 15 s (%.0f pings/s) would take %.1f cores for the pings alone.",
				us, thousands(goalConns), goalConns/15.0, us*goalConns/15/1e6)
		}
		if us := c.cpuPerPing(); us > 0 {
			p(" Here, at %.0f pings/s, a ping cost %.0f µs in all: %.2f cores (gateways %.2f, wsloads %.2f, Redis %.2f).",
				c.Renewals, us, c.GatewayCPU+c.LoadCPU+c.RedisCPU, c.GatewayCPU, c.LoadCPU, c.RedisCPU)
		}
		p(" A deployment with fewer connections per core pings as often as it likes; one that holds this many per core pings every minute or so, and sets the TTL and the idle timeout above the cadence, as here. The open-file limit of 20,000 per process, which cannot be raised here, asks for 13 or more gateways and as many load generators.\n\n")
	}
	p("| | |\n|---|---|\n")
	p("| sessions held (gateways' open connections) | **%.0f** |\n", c.Held)
	p("| wsload: connected, failed, dropped, closed by the gateway | %d, %d, %d, %d (%.0f held at the end) |\n", c.Load.Conns, c.Load.Failed, c.Load.Dropped, c.Load.Closed, held)
	p("| pings answered | %d pongs for %d pings |\n", c.Load.Pongs, c.Load.Pings)
	p("| ping→pong at the load generator, over the window (p50 / p99 / p99.9 / max) | %.1f / **%.1f** / %.1f / %.1f ms, %d pongs |\n",
		c.Pong.PongP50ms, c.Pong.PongP99ms, c.Pong.PongP999ms, c.Pong.PongMaxms, c.Pong.PongN)
	p("| gateway RSS per connection | **%.2f KB** |\n", c.RSSPerConnKB)
	p("| of which goroutine stacks (added by the load) | %.2f KB |\n", c.StackPerConn)
	p("| of which Go heap in use (added by the load) | %.2f KB |\n", c.HeapPerConn)
	p("| rest of RSS (heap not returned to the OS, runtime) | %.2f KB |\n", c.OtherPerConn)
	p("| gateway CPU, all %d | %.2f cores |\n", c.Gateways, c.GatewayCPU)
	p("| renewals, all gateways | %.0f/s, %.4f Redis round trips per renewal |\n", c.Renewals, c.TripsPerRen)
	p("| redis-server CPU | %.2f cores |\n", c.RedisCPU)
	p("| load generator: wsload CPU, RSS | %.2f cores, %.0f MB (%.1f KB per connection) |\n",
		c.LoadCPU, c.LoadRSSMB, c.LoadRSSMB*1024/float64(max(c.Load.Conns, 1)))
	p("\n| gateway | connections | RSS before | RSS loaded | RSS per conn | stacks per conn | heap per conn | goroutines | CPU |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, g := range c.PerGateway {
		p("| %s | %.0f | %.1f MB | %.1f MB | %.2f KB | %.2f KB | %.2f KB | %.0f | %.2f cores |\n",
			g.ID, g.Conns, g.RSSBaseMB, g.RSSMB, g.RSSPerConnKB, g.StackPerConn, g.HeapPerConnKB, g.Goroutines, g.CPUCores)
	}
	p("\n**Push routing.** %d guides were pushed, during the window, through the push endpoint of the gateway after the one holding the user, so each went over the holder's Redis Pub/Sub channel: %d answered delivered, %d push errors (%d sends again the gateway asked for: 409 while an instance of the user's route misses heartbeats, or 503); the clients received %d guides with %d distinct ids (%d lost, %d doubled).\n",
		c.Pushed, c.PushDelivered, c.PushErrors, c.PushRetries, c.Load.Guides, c.Load.GuideIDs, c.GuidesLost, c.GuidesDoubled)

	p("\n**Load generator: `loadtest/wsload` (Go), not k6.** Built the way the gateway is: no goroutine waits on an idle connection. Its reads go through the same read adapter as the gateway's, and two pinger goroutines per process send every ping, each from a queue of its connections by due time; ping→pong is timed per ping. %.1f KB of RSS per connection here. k6 keeps a JavaScript runtime per VU: about 140 KB per connection even with 50 connections per VU (loadtest/README.md), and every ping runs through JavaScript, on the two cores the gateways and Redis also need. The k6 scripts stay the tool for a deployment from other machines. wsload's processes stay under the 20,000 open files each (%d of them) and bind 127.10.p.x source addresses, %d per process, so no source address nears its %s ephemeral ports.\n",
		c.LoadRSSMB*1024/float64(max(c.Load.Conns, 1)), c.Loaders, c.IPsPerLoader, r.Machine.PortRange)

	if c.HeapTop != "" {
		p("\n**Heap profile of %s** (`go tool pprof -top -sample_index=inuse_space http://<push addr>/debug/pprof/heap`, taken under load):\n\n```\n%s\n```\n",
			c.PerGateway[0].ID, c.HeapTop)
	}
	if len(c.PerGateway) == 0 || c.Held == 0 {
		return // the step failed before it measured
	}
	g0 := c.PerGateway[0]
	if top := profilePerConn(c.HeapTop, g0.Conns, 8); len(top) > 0 {
		p("\nThe profile's largest in-use allocations, per connection of %s (sampled, so approximate):\n\n| allocated in | per connection |\n|---|---|\n", g0.ID)
		for _, t := range top {
			p("| `%s` | %.0f B |\n", t.fn, t.bytes)
		}
	}
	p("\n%s\n", memoryNote(c, g0))
	if len(c.GatewayLogs) > 0 {
		p("\nGateway log lines during the step, the connections' closes at the end included (%d wsload processes each spreading its closes over a few seconds): %s.\n",
			c.Loaders, strings.Join(c.GatewayLogs, "; "))
	}
}

// memoryNote says what holds a connection's memory: a parked reader's
// goroutine stack when there is one per connection, else the heap.
func memoryNote(c *Connections, g0 ConnGateway) string {
	if g0.Goroutines > g0.Conns/2 {
		perG := g0.StackPerConn * g0.Conns / g0.Goroutines
		return fmt.Sprintf("**What limits memory per connection.** Of %.2f KB of RSS per connection, %.2f KB is goroutine stacks: %.0f goroutines for %.0f connections on %s, one per connection, with %.1f KB of stack each. That goroutine is the reader, parked in `ReadMessage`; its stack grew past the 2 KB start during the upgrade and the first frames, and the runtime shrinks a stack only when a quarter of it is enough. The Go heap adds %.2f KB: the WebSocket connection with its read buffer, what net/http allocated for the connection before the hijack, the hub's entry, the connection's logger, its rate limiter and its socket addresses (table above). The remaining %.2f KB is heap the runtime holds but is not using, and its own metadata. Reading in epoll mode (`%s=epoll`) leaves no goroutine parked per idle connection: see step 7 for the two side by side.",
			c.RSSPerConnKB, c.StackPerConn, g0.Goroutines, g0.Conns, g0.ID, perG, c.HeapPerConn, c.OtherPerConn, readModeEnv)
	}
	return fmt.Sprintf("**What holds memory per connection.** %.0f goroutines for %.0f connections on %s: no reader waits on an idle connection, so stacks add %.2f KB per connection. The Go heap in use adds %.2f KB (the WebSocket connection and its buffers, the read adapter's entry, the hub's entry, the rate limiter: table above; live objects, and the garbage of the pings since the last collection, which the gateway's collector goal of GOGC=50 keeps to half the live heap), and %.2f KB is heap the runtime holds but is not using, and its own metadata. %.0f connections take %.1f GB of gateway RSS in all.",
		g0.Goroutines, g0.Conns, g0.ID, c.StackPerConn, c.HeapPerConn, c.OtherPerConn, c.Held, c.RSSPerConnKB*c.Held/1024/1024)
}

// thousands writes n with commas: 250,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

type allocation struct {
	fn    string
	bytes float64
}

// profilePerConn reads the flat column of pprof -top output and divides
// the n largest by conns.
func profilePerConn(top string, conns float64, n int) []allocation {
	var out []allocation
	if conns <= 0 {
		return nil
	}
	for _, line := range strings.Split(top, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[1], "%") {
			continue
		}
		b := parseSize(f[0])
		if b <= 0 {
			continue
		}
		out = append(out, allocation{fn: strings.Join(f[5:], " "), bytes: b / conns})
		if len(out) == n {
			break
		}
	}
	return out
}

// parseSize reads pprof's sizes: 14.72MB, 512.17kB, 880B.
func parseSize(s string) float64 {
	mult := 1.0
	for _, u := range []struct {
		suffix string
		m      float64
	}{{"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.m
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0
	}
	return f * mult
}
