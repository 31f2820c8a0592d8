package main

import (
	"context"
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/expiry"
	"github.com/stillthere/stillthere/pkg/session"
)

// idleReplica stands in for a second listener replica between two
// measurements. The modes and the storm run one after another on one key
// prefix, each with a listener of its own that stops before the next one
// starts. Left alone, the next listener would find that nobody marked a
// complete sweep for longer than sweep-gap-max, take it for a blind
// interval (rightly: in a deployment that means no replica swept, so
// nobody saw who lapsed), and hold every silence of the next measurement
// for the grace. A deployment always has a listener sweeping; so, from
// just before one listener stops until the next has run a while, this
// marks the index swept every sweep interval, as an idle replica that
// finds nothing due does. It takes no work, so it changes no figure of a
// measurement: while a measurement runs, its own listener alone marks.
type idleReplica struct {
	store *session.Store
	cfg   expiry.Config // the listeners' settings: sweep interval, gap and jump limits

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// start begins marking, unless it is marking already.
func (r *idleReplica) start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return
	}
	ctx, r.cancel = context.WithCancel(ctx)
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		t := time.NewTicker(r.cfg.SweepInterval)
		defer t.Stop()
		for {
			mctx, cancel := context.WithTimeout(ctx, time.Second)
			// No listener id: it is not a replica other replicas could
			// leave work to. No last-seen time: it does not judge data
			// loss, the listeners do.
			r.store.Mark(mctx, session.SweepMark{GapMax: r.cfg.SweepGapMax, Keep: time.Hour})
			cancel()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// stop ends the marking and waits for it; a no-op when not marking.
func (r *idleReplica) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.done
	r.cancel, r.done = nil, nil
}
