package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
)

// A push answers delivered once a connection took the guide, and the
// consumer is done with it; the guide then waits on that connection for
// its client's proof (see proof.go), in this process's memory. Should the
// process die before the proof (SIGKILL, OOM, a host gone), no handOn
// runs, and the guide would be lost with it. So before a guide is handed
// to live connections it is kept in the user's inbox, as for a user
// connected nowhere (keepAhead): the first proof of it on any connection
// takes it out again (aheadDrops). A process that dies first leaves it
// there, and the user's next connect, on any instance, is handed it. The
// inbox's own rules judge it then: stale once the user renewed after its
// deadline, superseded by the client's word, expired past its max age.
//
// The inbox holds one entry per guide id (see session.Store.KeepGuide),
// so the ways a guide goes on later (handed on, routed in after its
// user's connections ended, held and given back) keep it at most once;
// and a guide settled (proven on a connection, or found superseded or
// stale) is marked so for a while, so that a copy still on its way does
// not put it back for the next connect.
// A connection may be handed it from the inbox while it is on its way
// live (a device connecting meanwhile, a reconnect): the gateway sends a
// connection no pushed copy of an id it was sent (see hasGuide), and a
// client shows each id once (the JavaScript client does), so an inbox
// copy after a live one shows nothing twice.

// keepAhead keeps req in its user's inbox before it is handed to live
// connections, whoever is connected, and reports whether this kept it
// (not an earlier keep of it). A guide too old for the inbox goes out
// live unkept, as before. It trims nothing: the cap would push out an
// older guide no connection proved yet, and an entry kept ahead lasts
// only until a proof, or a connection's end hands it on.
func (g *Gateway) keepAhead(ctx context.Context, req push.Request, payload []byte) (bool, error) {
	n, err := g.store.KeepGuide(ctx, req.UID, session.Keep{Entry: payload, MaxAge: g.cfg.guideMaxAge(),
		From: inboxAgeFrom(req, false), TTL: g.cfg.InboxTTL})
	if err != nil {
		return false, fmt.Errorf("keep guide %s for %q ahead of its delivery: %w", req.ID, req.UID, err)
	}
	if n == session.KeptTooOld {
		metricPushes.WithLabelValues("ahead_too_old").Inc()
	}
	return n == session.KeptQueued, nil
}

// dropAhead takes req's entry out of its user's inbox at once, best
// effort: a route that kept it ahead, reached nobody and failed.
func (g *Gateway) dropAhead(ctx context.Context, req push.Request) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.WriteTimeout)
	defer cancel()
	if _, err := g.store.DropFromInboxes(dctx, []session.InboxDrop{{UID: req.UID, ID: req.ID}}, session.DropHow{}); err != nil {
		g.log.Debug("take a guide kept ahead out of the inbox", "uid", req.UID, "guide_id", req.ID, "err", err)
	}
}

// settledFor is how long a guide proven received (or found superseded or
// stale) is not kept again: a copy of it still on its way (handed on from
// a connection that never proved it, held and given back) comes within a
// write timeout or two; the max age bounds what an inbox would keep.
func (g *Gateway) settledFor() time.Duration { return g.cfg.guideMaxAge() }

// inboxAgeFrom is the Unix ms an inbox entry of req counts its max age
// from; 0: from when it is kept. Stage 1 is due at the deadline, and
// its max age counts from there, or from when the listener found it due,
// if later: an outage that held it, or a restore after Redis lost it,
// only delayed it. A later stage was due its delays after it, which the
// request does not say: its max age counts from when it is kept, as an
// undated guide's does, or a stage due minutes after the deadline would
// be too old on arrival. The consumer judged its age from when it was
// due. A close applied (closed) counts from now too: it is news since.
func inboxAgeFrom(req push.Request, closed bool) int64 {
	if req.Stage > 1 || closed || req.DeadlineMS <= 0 {
		return 0
	}
	return max(req.DeadlineMS, req.DetectedMS)
}

const (
	// aheadQueue bounds the drops waiting for Redis. One that finds it
	// full is not made: its entry stays in the inbox, where the next
	// connect finds it stale, or hands over a guide the client has shown.
	aheadQueue = 4096
	// aheadBatch is the most drops in one round trip.
	aheadBatch = 256
)

// aheadDrops takes guides kept ahead out of the inbox once proven, in
// batches, on one goroutine (run), so that a proof, read on a
// connection's reader, never waits for Redis.
type aheadDrops struct {
	g  *Gateway
	ch chan session.InboxDrop
}

func newAheadDrops(g *Gateway) *aheadDrops {
	return &aheadDrops{g: g, ch: make(chan session.InboxDrop, aheadQueue)}
}

// add asks for uid's entry of guide id to leave the inbox. It never
// blocks.
func (a *aheadDrops) add(uid, id string) {
	select {
	case a.ch <- session.InboxDrop{UID: uid, ID: id}:
	default:
		metricPushes.WithLabelValues("ahead_drop_skipped").Inc()
	}
}

// run drops what add asks for until ctx ends, and then what is queued.
func (a *aheadDrops) run(ctx context.Context) {
	batch := make([]session.InboxDrop, 0, aheadBatch)
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.g.cfg.WriteTimeout)
			defer cancel()
			for {
				batch = batch[:0]
			more:
				for len(batch) < aheadBatch {
					select {
					case d := <-a.ch:
						batch = append(batch, d)
					default:
						break more
					}
				}
				if len(batch) == 0 || a.flush(fctx, batch) != nil {
					return
				}
			}
		case d := <-a.ch:
			batch = append(batch[:0], d)
		fill:
			for len(batch) < aheadBatch {
				select {
				case d := <-a.ch:
					batch = append(batch, d)
				default:
					break fill
				}
			}
			fctx, cancel := context.WithTimeout(ctx, a.g.cfg.WriteTimeout)
			a.flush(fctx, batch)
			cancel()
		}
	}
}

// flush drops a batch in one round trip. A drop that fails is not made
// again: its entry stays (see aheadQueue).
func (a *aheadDrops) flush(ctx context.Context, batch []session.InboxDrop) error {
	start := time.Now()
	n, err := a.g.store.DropFromInboxes(ctx, batch, session.DropHow{Settled: a.g.settledFor()})
	metricPushes.WithLabelValues("ahead_dropped").Add(float64(n))
	if err != nil {
		a.g.routeLog.Fail(fmt.Errorf("take %d of %d proven guides out of their inboxes in %v: %w", len(batch)-n, len(batch), time.Since(start).Round(time.Millisecond), err))
	}
	return err
}
