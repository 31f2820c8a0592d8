package redisconn

import (
	"cmp"
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Run is one start of a Redis server: its run id, new at every start, and
// how long it had been up when read (whole seconds, rounded down).
type Run struct {
	ID string
	Up time.Duration
}

// MasterRuns reads the run of every master rdb talks to, by address: a
// cluster's masters, or the one server of any other client. A server
// that does not say its run id is left out.
func MasterRuns(ctx context.Context, rdb redis.UniversalClient) (map[string]Run, error) {
	runs := map[string]Run{}
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		run, err := readRun(ctx, rdb)
		if err == nil && run.ID != "" {
			runs[addrOf(rdb)] = run
		}
		return runs, err
	}
	// ForEachMaster calls back concurrently; the masters are read one
	// after another after it, so runs is not shared.
	var mu sync.Mutex
	var masters []*redis.Client
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		masters = append(masters, m)
		mu.Unlock()
		return nil
	})
	for _, m := range masters {
		run, e := readRun(ctx, m)
		if e != nil {
			err = cmp.Or(err, e)
			continue
		}
		if run.ID != "" {
			runs[m.Options().Addr] = run
		}
	}
	return runs, err
}

func readRun(ctx context.Context, c redis.Cmdable) (Run, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return Run{}, err
	}
	up, _ := strconv.ParseInt(InfoField(info, "uptime_in_seconds"), 10, 64)
	return Run{ID: InfoField(info, "run_id"), Up: time.Duration(up) * time.Second}, nil
}

// InfoField is one field of an INFO reply, "" when it has none.
func InfoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
