package expiry

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisconn"
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
	if _, ok := rdb.(*redis.ClusterClient); !ok {
		return nil
	}
	runs, err := redisconn.MasterRuns(ctx, rdb)
	if err != nil {
		return nil
	}
	ids := make(map[string]string, len(runs))
	for addr, run := range runs {
		ids[addr] = run.ID
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
