package main

import (
	"fmt"
	"strconv"
	"strings"
)

func (r *Report) connectionsMD(b *strings.Builder, c *Connections) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("\n## 1. Connections\n\n`%s`\n\n", c.Command)
	held := float64(c.Load.Conns - c.Load.Dropped - c.Load.Closed)
	p("%d connections aimed at %d gateway processes (each its own ports and instance id, all on one redis-server) from %d wsload processes, each pinging every %s; measured over %.0f s once every connection was up and had pinged.\n\n",
		c.Target, c.Gateways, c.Loaders, c.PingEvery, c.WindowSec)
	p("| | |\n|---|---|\n")
	p("| sessions held (gateways' open connections) | **%.0f** |\n", c.Held)
	p("| wsload: connected, failed, dropped, closed by the gateway | %d, %d, %d, %d (%.0f held at the end) |\n", c.Load.Conns, c.Load.Failed, c.Load.Dropped, c.Load.Closed, held)
	p("| pings answered | %d pongs for %d pings |\n", c.Load.Pongs, c.Load.Pings)
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
	p("\n**Push routing.** %d guides were pushed, during the window, through the push endpoint of the gateway after the one holding the user, so each went over the holder's Redis Pub/Sub channel: %d answered delivered, %d push errors; the clients received %d guides with %d distinct ids (%d lost, %d doubled).\n",
		c.Pushed, c.PushDelivered, c.PushErrors, c.Load.Guides, c.Load.GuideIDs, c.GuidesLost, c.GuidesDoubled)

	p("\n**Load generator: `loadtest/wsload` (Go), not k6.** One goroutine pair and two 512-byte buffers per connection: %.1f KB of RSS per connection here, so 100k connections fit beside six gateways in this machine's memory. k6 keeps a JavaScript runtime per VU: about 140 KB per connection even with 50 connections per VU (loadtest/README.md), some 14 GB for 100k, and every ping runs through JavaScript, on the two cores the six gateways and Redis also need. The k6 scripts stay the tool for a deployment from other machines. wsload's processes stay under the 20,000 open files each (%d of them) and bind 127.10.p.x source addresses, %d per process, so no source address nears its %s ephemeral ports.\n",
		c.LoadRSSMB*1024/float64(max(c.Load.Conns, 1)), c.Loaders, c.IPsPerLoader, r.Machine.PortRange)

	if c.HeapTop != "" {
		p("\n**Heap profile of %s** (`go tool pprof -top -sample_index=inuse_space http://<push addr>/debug/pprof/heap`, taken under load):\n\n```\n%s\n```\n",
			c.PerGateway[0].ID, c.HeapTop)
	}
	if len(c.PerGateway) == 0 || c.Held == 0 {
		return // the step failed before it measured
	}
	g0 := c.PerGateway[0]
	perG := 0.0
	if g0.Goroutines > 0 {
		perG = g0.StackPerConn * g0.Conns / g0.Goroutines
	}
	if top := profilePerConn(c.HeapTop, g0.Conns, 8); len(top) > 0 {
		p("\nThe profile's largest in-use allocations, per connection of %s (sampled, so approximate):\n\n| allocated in | per connection |\n|---|---|\n", g0.ID)
		for _, t := range top {
			p("| `%s` | %.0f B |\n", t.fn, t.bytes)
		}
	}
	p("\n**What limits memory per connection.** Of %.2f KB of RSS per connection, %.2f KB is goroutine stacks: %.0f goroutines for %.0f connections on %s, one per connection, with %.1f KB of stack each. That goroutine is the reader, parked in `ReadMessage` on the HTTP handler's goroutine; its stack grew past the 2 KB start during the upgrade and the first frames, and the runtime shrinks a stack only when a quarter of it is enough. Idle connections need no writer goroutine (the flusher runs only while frames wait). The Go heap adds %.2f KB: the WebSocket connection with its 512-byte read buffer, what net/http allocated for the connection before the hijack, the hub's entry, the connection's logger, its rate limiter and its socket addresses (table above). The remaining %.2f KB is heap the runtime holds but is not using, and its own metadata.\n",
		c.RSSPerConnKB, c.StackPerConn, g0.Goroutines, g0.Conns, g0.ID, perG, c.HeapPerConn, c.OtherPerConn)
	p("\n**What would close the gap to 10 KB.** The stacks are the gap. Without a parked goroutine per idle connection (wait for readability on the netpoller, epoll, and read a frame only when one arrives, with a small pool of goroutines doing the reads, as gobwas/ws-style servers do) each connection would cost the heap share, about %.1f KB. That means reading WebSocket frames without a blocking `ReadMessage`, a change to the gateway's connection loop. Smaller steps: run the read loop on a fresh goroutine after the upgrade, so its stack holds only the loop and may stay at 4 KB; and drop per-connection allocations that outlive the handshake (the logger built with `.With`, the rate limiter until the first frame). Memory is not what limits this machine: %.0f connections take %.1f GB of gateway RSS in all.\n",
		c.HeapPerConn+c.OtherPerConn, c.Held, c.RSSPerConnKB*c.Held/1024/1024)
	if len(c.GatewayLogs) > 0 {
		p("\nGateway log lines during the step, the connections' closes at the end included (%d wsload processes each spreading its closes over a few seconds): %s.\n",
			c.Loaders, strings.Join(c.GatewayLogs, "; "))
	}
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
