package expiry

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
)

// restarts notices a Redis Cluster master that restarted by its run id,
// which changes with every start. A restart quicker than the sweep gap
// would otherwise pass unseen, though pings sent while it was down were
// lost. The sweep mark itself checks the master of the control keys (and
// a single Redis) atomically; this covers the other masters, a check
// interval late. Only markLoop uses it.
type restarts struct {
	runIDs map[string]string // by master address
	seen   time.Time         // Redis's time at the last check
}

// check compares each master's run id with the last one seen, and records
// a blind interval from the last check to now for every master that
// restarted in between.
func (r *restarts) check(ctx context.Context, rdb redis.UniversalClient, store *session.Store, now time.Time) []string {
	ids := map[string]string{}
	read := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return err
		}
		if id := infoField(info, "run_id"); id != "" {
			ids[c.Options().Addr] = id
		}
		return nil
	}
	c, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	// ForEachMaster calls back concurrently; the masters are read one
	// after another after it, so ids is not shared.
	var mu sync.Mutex
	var masters []*redis.Client
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		masters = append(masters, m)
		mu.Unlock()
		return nil
	})
	for _, m := range masters {
		if e := read(ctx, m); e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		return nil
	}
	var restarted []string
	for addr, id := range ids {
		if old, ok := r.runIDs[addr]; ok && old != id && !r.seen.IsZero() {
			restarted = append(restarted, addr)
		}
	}
	if len(restarted) > 0 {
		b := session.BlindInterval{Start: r.seen, End: now, Reason: session.BlindRestart}
		if err := store.RecordBlind(ctx, b); err != nil {
			return nil // checked again next time, against the old ids
		}
	}
	r.runIDs, r.seen = ids, now
	return restarted
}

// infoField is one field of an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
