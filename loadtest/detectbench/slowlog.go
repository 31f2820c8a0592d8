package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
)

// Redis's time by script: INFO commandstats counts every EVALSHA as one
// command, whatever script it runs. With -storm-slowlog the storm's
// release logs every command Redis runs for slowlogMinUS or longer and
// sums the SLOWLOG's durations by script (the EVALSHA's hash) or command.
// The SLOWLOG times a command's execution alone, not reading and
// answering it; a script's time includes the commands it calls, which
// are logged too when they take as long (rarely: a microsecond or two).
// Logging every command (0) would log each call a script makes, and
// slow each script by much more than it measures.

var stormSlowlog bool

// slowlogMax bounds the entries kept.
const slowlogMax = 1_000_000

// slowlogMinUS is the shortest command logged, in microseconds: the
// storm's scripts take tens to thousands.
const slowlogMinUS = 10

// startSlowlog makes Redis log, from now, every command of slowlogMinUS
// or more, its log emptied.
func startSlowlog(ctx context.Context, rdb *redis.Client) error {
	if err := rdb.ConfigSet(ctx, "slowlog-max-len", fmt.Sprint(slowlogMax)).Err(); err != nil {
		return err
	}
	if err := rdb.Do(ctx, "SLOWLOG", "RESET").Err(); err != nil {
		return err
	}
	return rdb.ConfigSet(ctx, "slowlog-log-slower-than", fmt.Sprint(slowlogMinUS)).Err()
}

// slowlogCost is one script's or command's calls and time in the log.
type slowlogCost struct {
	name  string
	calls int
	usec  int64
}

// stopSlowlog stops logging, reads the log and prints its sums to w,
// heaviest first, and restores Redis's default.
func stopSlowlog(ctx context.Context, rdb *redis.Client, w io.Writer, held int) {
	defer rdb.ConfigSet(ctx, "slowlog-log-slower-than", "10000")
	if err := rdb.ConfigSet(ctx, "slowlog-log-slower-than", "-1").Err(); err != nil {
		fmt.Fprintf(w, "detectbench: slowlog: %v\n", err)
		return
	}
	logs, err := rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		fmt.Fprintf(w, "detectbench: slowlog: %v\n", err)
		return
	}
	names := session.ScriptNames()
	by := map[string]*slowlogCost{}
	var total int64
	for _, l := range logs {
		name := "?"
		if len(l.Args) > 0 {
			name = strings.ToLower(l.Args[0])
			if (name == "evalsha" || name == "evalsha_ro") && len(l.Args) > 1 {
				name = "script " + cmp.Or(names[l.Args[1]], l.Args[1])
			}
		}
		c := by[name]
		if c == nil {
			c = &slowlogCost{name: name}
			by[name] = c
		}
		c.calls++
		c.usec += l.Duration.Microseconds()
		total += l.Duration.Microseconds()
	}
	costs := make([]*slowlogCost, 0, len(by))
	for _, c := range by {
		costs = append(costs, c)
	}
	slices.SortFunc(costs, func(a, b *slowlogCost) int { return cmp.Compare(b.usec, a.usec) })
	fmt.Fprintf(w, "detectbench: storm, from the first release, Redis's SLOWLOG (commands of 10 us or more): %d commands, %.3f s executing (per held timeout: %.1f us)\n",
		len(logs), float64(total)/1e6, float64(total)/float64(max(held, 1)))
	for _, c := range costs {
		fmt.Fprintf(w, "  %-28s %7d calls %8.3f s %6.1f%% %8.1f us/call %6.2f us/held\n", c.name, c.calls, float64(c.usec)/1e6,
			100*float64(c.usec)/float64(max(total, 1)), float64(c.usec)/float64(c.calls), float64(c.usec)/float64(max(held, 1)))
	}
}
