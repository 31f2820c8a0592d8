package expiry

import (
	"context"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// brake is the mass-expiry brake. Far more sessions lapsing in a short
// window than normal (a share of the live sessions, above a floor) is more
// likely an outage nobody measured than a crowd leaving: a network
// partition between the users and us, a load balancer dropping
// connections. The lapses past the threshold are held until the grace
// after their deadlines and checked again before they are produced; a
// real crowd still gets its guides, one grace late. Later stages falling
// due while it is engaged are held too (see brakeFresh). Lapses are counted in Redis, so that replicas
// that share the work share the count. Only the pipeline goroutine uses
// it.
type brake struct {
	engaged bool
	held    int // held since engaged, for the log line that ends it
}

// threshold is the most lapses within the window before the brake
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
		l.brake.engaged, l.brake.held = true, 0
		metricBrake.Set(1)
		l.log.Warn("mass expiry: far more sessions lapsed than normal; holding them for the grace, then checking each again before it is produced",
			"lapsed", count, "window", l.cfg.MassExpiryWindow, "threshold", threshold,
			"live_sessions", l.marker.sessions.Load(), "grace", l.cfg.OutageGrace)
	case !over && l.brake.engaged:
		l.brake.engaged = false
		metricBrake.Set(0)
		l.log.Info("mass expiry over; timeouts are produced at once again",
			"held", l.brake.held, "lapsed", count, "threshold", threshold)
	}
	return l.brake.engaged
}

// hold moves timeouts out of the index until release, counting them by
// rule.
func (l *Listener) hold(ctx context.Context, found []session.Expired, release time.Time, rule string) error {
	n, err := l.store.Hold(ctx, found, release)
	metricHeld.WithLabelValues(rule).Add(float64(n))
	return err
}

// holdBraked holds timeouts for the brake until the grace after each was
// due, as a blind interval holds until the grace after its end: not after
// its detection, which a storm makes late, so a crowd that really left
// is guided a grace after its deadlines and not later. One found a grace
// late or more is still held to the next sweep and checked again then.
func (l *Listener) holdBraked(ctx context.Context, found []session.Expired, now time.Time) error {
	n, err := l.store.HoldEach(ctx, found, func(e session.Expired) time.Time {
		return later(e.Due.Add(l.cfg.OutageGrace), now.Add(l.cfg.SweepInterval))
	})
	metricHeld.WithLabelValues(holdBrake).Add(float64(n))
	l.brake.held += n
	return err
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
