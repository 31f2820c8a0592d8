package expiry

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackPrefetchRestartEveryReplicaReadsAgain: Redis restarts while
// two replicas read ahead. Only the first mark after the restart finds the
// new run id; the other replica's marks find it recorded already. Each
// replica must still read its windows again from now, or the deadlines
// written after the restart inside the window it read before wait for a
// read past them instead of their timers.
func TestAttackPrefetchRestartEveryReplicaReadsAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	cfg := h.slowReads()
	a, stopA := h.startListener(cfg)
	cfgB := cfg
	cfgB.SpoolDir = t.TempDir() // each replica its own, as each pod
	b, stopB := h.startListener(cfgB)
	waitFor(t, waitLong, "both marks", func() bool {
		return h.listenerMark(a.marker.id) != "" && h.listenerMark(b.marker.id) != ""
	})
	// Each owns a share, so each read its windows 30s ahead once.
	waitFor(t, waitLong, "both replicas to own a share", func() bool {
		return a.marker.cur.Load() != nil && b.marker.cur.Load() != nil &&
			len(replicasAlive(a.marker.id, *a.marker.cur.Load(), a.listenerFresh())) == 1 &&
			len(replicasAlive(b.marker.id, *b.marker.cur.Load(), b.listenerFresh())) == 1
	})
	before := len(h.blindList(ctx))
	if err := h.srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "the restart to be marked", func() bool { return len(h.blindList(ctx)) > before })
	restarted := h.redisNow()
	waitFor(t, waitLong, "both replicas to mark after the restart", func() bool {
		ca, cb := a.marker.cur.Load(), b.marker.cur.Load()
		return !ca.Now.Before(restarted) && !cb.Now.Before(restarted)
	})
	// Past the restart's grace, and spread over a whole read interval: a
	// replica that waits for a read past each finds most of them seconds
	// late.
	after := h.silentOver("after", 40, cfg.PrefetchInterval+2*time.Second, cfg.PrefetchInterval)
	waitFor(t, waitLong+2*cfg.PrefetchInterval, "every event", func() bool { return h.produced() >= int64(len(after)) })
	h.waitSettled(slices.Collect(maps.Keys(after)))
	stopA()
	stopB()
	evs := h.events()
	checkExactlyOnce(t, evs, after, timeoutevent.SourceSweep)
	late := 0
	for _, d := range lateness(t, evs, after) {
		if d > 3*time.Second {
			late++
		}
	}
	if late > 0 {
		t.Errorf("%d of %d deadlines written after the restart found more than 3s late: a replica kept the windows it read before the restart", late, len(after))
	}
}
