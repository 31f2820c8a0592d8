package expiry

import (
	"context"
	"time"
)

// brake is the mass-expiry brake. Far more sessions lapsing in a short
// window than normal (a share of the live sessions, above a floor) is more
// likely an outage nobody measured than a crowd leaving: a network
// partition between the users and us, a load balancer dropping
// connections. The lapses past the threshold are held until the grace
// after their deadlines and checked again before they are produced; a
// real crowd still gets its guides, one grace late. Later stages falling
// due while it is engaged are held too (see brakeWouldHold). Lapses are
// counted in Redis, so that replicas that share the work share the
// count. Only the pipeline goroutine uses it.
type brake struct {
	engaged bool
	holds   int // timeouts it held since engaged, for the log line that ends it
}

// brakeThreshold is the most lapses within the window before the brake
// engages.
func (l *Listener) brakeThreshold() int {
	share := int(l.cfg.MassExpiryShare * float64(l.marker.sessions.Load()))
	return max(l.cfg.MassExpiryFloor, share)
}

// braking counts n fresh lapses detected at now and reports whether they
// must be held. A failure to count does not engage it.
func (l *Listener) braking(ctx context.Context, now time.Time, n int) bool {
	count, err := l.store.Lapses(ctx, now, l.cfg.MassExpiryWindow, n)
	if err != nil {
		l.log.Debug("count lapses for the mass-expiry brake", "err", err)
		return l.brake.engaged
	}
	threshold := l.brakeThreshold()
	switch over := count > threshold; {
	case over && !l.brake.engaged:
		l.brake.engaged, l.brake.holds = true, 0
		metricBrake.Set(1)
		l.log.Warn("mass expiry: far more sessions lapsed than normal; holding them for the grace, then checking each again before it is produced",
			"lapsed", count, "window", l.cfg.MassExpiryWindow, "threshold", threshold,
			"live_sessions", l.marker.sessions.Load(), "grace", l.cfg.OutageGrace)
	case !over && l.brake.engaged:
		l.brake.engaged = false
		metricBrake.Set(0)
		l.log.Info("mass expiry over; timeouts are produced at once again",
			"held", l.brake.holds, "lapsed", count, "threshold", threshold)
	}
	return l.brake.engaged
}
