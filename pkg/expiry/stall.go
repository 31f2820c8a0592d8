package expiry

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
)

// A round trip to Redis that stalls (a master paused, or holding its
// writes as a graceful failover does; a cluster down under the client's
// retries) stalls the users' renewals to the same master as long, while
// marks on the control keys' master may go on: no sweep gap shows, and
// the gateways record their renewals' outage only once Redis answers
// them again, maybe after this replica judged the deadlines that fell in
// it. So every round trip of this replica's Redis client is timed
// (stallHook), whatever it was for (a read of the deadlines, a dedup mark
// or settle while a batch is produced, a look at the masters): one longer
// than stallMin is a stall, and the timeouts that fell due from just
// before it to its end wait stallSettle after its end, on every judgement
// of this replica, and are judged again then (see outageHold). It is this
// replica's own: never recorded, so that one host's slow network costs
// its own finds that wait and no one else's.

// stallMin is how long a round trip to Redis may take before it stalled:
// half as long as a gateway's renewals may before they are an outage it
// records (renewals-gap, 1 s), since the round trip may have begun well
// into the stall (a timer that fired in it).
const stallMin = 500 * time.Millisecond

// stallSettle is how long after a stall the timeouts that fell due in it
// wait: long enough for the gateways, whose renewals stalled as long, to
// record it on their next heartbeat (every second by default), after
// which the blind interval they record holds those timeouts for the
// grace.
const stallSettle = 3 * time.Second

// stallWindow is the span of the round trips that stalled, by this host's
// clock: from the first's start to the last's end; zero when none.
type stallWindow struct {
	mu         sync.Mutex
	start, end time.Time
}

// note adds a round trip from start to end, if it stalled.
func (w *stallWindow) note(start, end time.Time) {
	if end.Sub(start) <= stallMin {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.start.IsZero() || start.Before(w.start) {
		w.start = start
	}
	if end.After(w.end) {
		w.end = end
	}
}

// take returns the span noted and forgets it.
func (w *stallWindow) take() (start, end time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	start, end = w.start, w.end
	w.start, w.end = time.Time{}, time.Time{}
	return start, end
}

// placeStalls turns the stalls noted since the last mark into one of
// m.stalls, by Redis's clock: now is Redis's, read at this host's at.
// Under mu.
func (m *marker) placeStalls(now, at time.Time) {
	start, end := m.stalled.take()
	if start.IsZero() {
		return
	}
	b := stallInterval(start, end, now, at)
	metricBlind.WithLabelValues(b.Reason).Inc()
	m.log.Warn("a round trip to Redis stalled; timeouts that fell due in it wait, then are checked again",
		"from", b.Start.UTC().Format(time.RFC3339Nano), "to", b.End.UTC().Format(time.RFC3339Nano),
		"lasted", end.Sub(start).Round(time.Millisecond), "wait", stallSettle)
	// Apart from those before, not merged: a merged one would grow with
	// every stall of a link that keeps stalling, and hold what fell in
	// its first until the last was over.
	m.stalls = append(m.stalls, b)
}

// stallInterval is the blind interval of round trips that stalled from
// start to end (this host's clock), placed by Redis's clock now, read at
// this host's at: from stallMin before the first began (the stall may
// have begun before it) to the last's end.
func stallInterval(start, end, now, at time.Time) session.BlindInterval {
	return session.BlindInterval{
		Start:  now.Add(-at.Sub(start) - stallMin),
		End:    now.Add(-at.Sub(end)),
		Reason: session.BlindReadStall,
	}
}

// stallHook times every round trip of the listener's Redis client into w.
type stallHook struct{ w *stallWindow }

func (stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		h.w.note(start, time.Now())
		return err
	}
}

func (h stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		h.w.note(start, time.Now())
		return err
	}
}
