package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redisCost is what Redis had done so far: its CPU (INFO cpu, user and
// system) and, per command, its calls and the time spent in them (INFO
// commandstats, which counts the commands scripts run too).
type redisCost struct {
	cpuS  float64
	calls map[string]cmdCost
}

type cmdCost struct {
	calls int64
	usec  int64
}

// readRedisCost reads INFO cpu and commandstats; zero when Redis does not
// answer.
func readRedisCost(ctx context.Context, rdb *redis.Client) redisCost {
	c := redisCost{calls: map[string]cmdCost{}}
	s, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return c
	}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, _ := strconv.ParseFloat(v, 64)
				c.cpuS += x
			}
		}
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok {
			continue
		}
		var cc cmdCost
		for _, kv := range strings.Split("calls="+rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				cc.calls = n
			case "usec":
				cc.usec = n
			}
		}
		c.calls[strings.TrimPrefix(name, "cmdstat_")] = cc
	}
	return c
}

// since is what Redis did between before and c.
func (c redisCost) since(before redisCost) redisCost {
	d := redisCost{cpuS: c.cpuS - before.cpuS, calls: map[string]cmdCost{}}
	for name, cc := range c.calls {
		b := before.calls[name]
		if cc.calls > b.calls {
			d.calls[name] = cmdCost{calls: cc.calls - b.calls, usec: cc.usec - b.usec}
		}
	}
	return d
}

// total is the calls and the time in them, over every command.
func (c redisCost) total() (calls, usec int64) {
	for _, cc := range c.calls {
		calls += cc.calls
		usec += cc.usec
	}
	return calls, usec
}

// print writes the commands by time spent, with their calls per unit
// (a timeout, say).
func (c redisCost) print(w io.Writer, label string, units int) {
	calls, usec := c.total()
	fmt.Fprintf(w, "detectbench: %s: Redis CPU %.2f s, %d calls (%.1f per %s of %d), %.2f s in commands\n",
		label, c.cpuS, calls, float64(calls)/float64(max(units, 1)), "timeout", units, float64(usec)/1e6)
	names := make([]string, 0, len(c.calls))
	for n := range c.calls {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return int(c.calls[b].usec - c.calls[a].usec) })
	for _, n := range names {
		cc := c.calls[n]
		fmt.Fprintf(w, "  %-16s %9d calls %6.2f/timeout %8.3f s %6.2f us/call\n",
			n, cc.calls, float64(cc.calls)/float64(max(units, 1)), float64(cc.usec)/1e6, float64(cc.usec)/float64(max(cc.calls, 1)))
	}
}
