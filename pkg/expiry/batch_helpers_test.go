package expiry

import (
	"context"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// holdBraked holds found as the brake's verdict at now holds each
// (brakeRelease), through the hold the batch's steps use.
func (l *Listener) holdBraked(ctx context.Context, found []session.Expired, now time.Time) error {
	f := facts{control: session.Control{Now: now}, grace: l.cfg.OutageGrace, sweepEvery: l.cfg.SweepInterval}
	_, err := l.holdEach(ctx, ruleBrake, found, func(e session.Expired) time.Time {
		return brakeRelease(f, timeout{Expired: e})
	})
	return err
}
