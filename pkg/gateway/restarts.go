package gateway

import (
	"context"
	"time"

	"github.com/stillthere/stillthere/pkg/redisconn"
)

// A Redis master that restarts without its data (no persistence, a node
// replaced by an empty one) loses the sessions, routes and pending
// timeouts of the users whose slots it serves. A heartbeat notices that
// only of the master holding the control keys (this instance's heartbeat
// is gone from it), and a failed renewal only from the moment it failed:
// a grant that ran out on another master between its restart and then,
// or whose user never pinged again, was lost, and no resync restored it.
//
// So watchRestarts reads every master's run id, which changes with every
// start, each heartbeat interval: one INFO per master, on a loop of its
// own, as a master paused mid-read must not hold up the heartbeat. A run
// id that changed is a restart. It owes what a heartbeat that found the
// data lost owes (see beat): every user registered again in their route,
// and a resync that hands over the grants that ran out since the master
// started. Those cannot have been guided: the listener finds a silence
// due at its deadline, by which time that master had lost it. The start
// is never taken too early: a silence that ran out before it may have
// been guided before the data went, and a restore would guide it twice.
// Redis says its uptime in whole seconds, the second it reads its clock
// in less the second it started in, which puts the start up to a second
// either side of uptime back from the read; a second later than that is
// after it, and up to two seconds late (what ran out in those is lost
// with the data, as before a look). A master first seen (a replica
// promoted, which kept the data) tells nothing, and nor does a master
// that was down for a while before it started again, nor one that
// restarted twice between two looks: what ran out before its latest
// start is lost with the data.

// watchRestarts looks for restarted masters every heartbeat interval
// until ctx is done, against the runs Open read first.
func (g *Gateway) watchRestarts(ctx context.Context) {
	t := time.NewTicker(g.cfg.HeartbeatInterval)
	defer t.Stop()
	runs := g.masterRuns
	if runs == nil {
		runs = map[string]redisconn.Run{}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, g.cfg.HeartbeatInterval)
		read, err := redisconn.MasterRuns(rctx, g.rdb)
		cancel()
		if err != nil {
			// What was read still counts; a master not read is compared
			// the next time it is.
			g.log.Debug("read the Redis masters' run ids", "err", err)
		}
		since, restarted := restartedSince(runs, read, err == nil, time.Now())
		if !restarted {
			continue
		}
		g.log.Warn("a Redis master restarted, and may have lost its data; registering every user again and resyncing every session", "since", since)
		metricRestartsSeen.Inc()
		g.reach.lostSince(since)
		g.restartSeen.Store(true)
	}
}

// restartedSince records the runs read at now (after the read) in runs,
// and reports whether a master already in runs restarted, and the
// earliest time by the local clock at which those had all started (see
// watchRestarts). A complete read (every master answered) forgets the
// nodes that are masters no longer: one that comes back as a master
// later (a replica promoted, holding the data it synced) is first seen
// then, not taken for a restart of the master it once was.
func restartedSince(runs, read map[string]redisconn.Run, complete bool, now time.Time) (since time.Time, restarted bool) {
	for addr, run := range read {
		if old, seen := runs[addr]; seen && old.ID != run.ID {
			if start := now.Add(time.Second - run.Up); !restarted || start.Before(since) {
				since, restarted = start, true
			}
		}
		runs[addr] = run
	}
	if complete {
		for addr := range runs {
			if _, ok := read[addr]; !ok {
				delete(runs, addr)
			}
		}
	}
	return since, restarted
}
