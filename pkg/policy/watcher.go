package policy

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/stillthere/stillthere/pkg/outage"
)

// Watcher keeps the current policy, polling the store. Gateways watch it
// for the TTLs they grant, expiry listeners for the stages they schedule.
//
// Once it has loaded a stored policy, it keeps the last one it loaded if
// the key vanishes. The key does not vanish by anyone's choice: the
// command offers no delete, and a Redis that lost its data (a restart
// without persistence, a failover to a replica that missed the write)
// loses it. Falling back to the configured TTL and stages then would
// silently give every segment a TTL, or a close, nobody chose. An operator
// who wants the configured values back stores them with "gateway policy
// set"; a service started while no policy is stored uses its configured
// values, so a fleet is consistent again once one is stored.
//
// Likewise it keeps the policy in force, and warns once, when the stored
// one has a TTL under twice its renewal granularity (see
// CheckGranularity): "gateway policy set" refuses such a policy, but
// another tool, or a gateway configured with a smaller granularity, may
// have stored it.
type Watcher struct {
	store       *Store
	fallback    Policy
	every       time.Duration
	granularity time.Duration
	log         *slog.Logger
	cur         atomic.Pointer[Policy]
	loaded      atomic.Bool // a stored policy was loaded once
	missing     atomic.Bool // the stored policy vanished after that; warned once
	// refused is the stored policy last refused for the granularity,
	// warned once; nil when the stored one applies.
	refused atomic.Pointer[string]
	fails   *outage.Log
}

// NewWatcher starts from fallback, the policy that applies while none is
// stored (see Fallback), and polls every interval once Run is called.
// granularity is the gateway's renew-granularity; a stored policy too
// short for it is not applied. An expiry listener, which grants no TTL,
// passes 0: it applies the stages of any valid stored policy, also one
// whose TTLs gateways with a coarser granularity refuse.
func NewWatcher(store *Store, fallback Policy, every, granularity time.Duration, logger *slog.Logger) *Watcher {
	w := &Watcher{store: store, fallback: fallback, every: every, granularity: granularity, log: logger,
		fails: outage.NewLog(logger, "refresh timeout policy", 0)}
	w.cur.Store(&fallback)
	return w
}

// Current is the policy in force.
func (w *Watcher) Current() Policy { return *w.cur.Load() }

// Refresh loads the stored policy once. A policy that cannot be read
// leaves the current one in force, and so do one that vanished after one
// was loaded and one too short for the renewal granularity (see Watcher).
func (w *Watcher) Refresh(ctx context.Context) error {
	p, err := w.store.Load(ctx)
	if err == nil {
		if bad := p.CheckGranularity(w.granularity); bad != nil {
			w.refuse(p, bad)
			return nil
		}
	}
	if err == nil || errors.Is(err, ErrNone) {
		w.refused.Store(nil) // a later refusal warns again
	}
	switch {
	case errors.Is(err, ErrNone) && w.loaded.Load():
		if !w.missing.Swap(true) {
			w.log.Warn("timeout policy missing from Redis; keeping the last known one",
				"policy", w.Current().String(), "fix", "store it again with: gateway policy set")
		}
		return nil
	case errors.Is(err, ErrNone):
		p = w.fallback
	case err != nil:
		return err
	default:
		w.loaded.Store(true)
		w.missing.Store(false)
	}
	if old := w.cur.Load(); !old.Equal(p) {
		w.log.Info("timeout policy in force", "policy", p.String())
	}
	w.cur.Store(&p)
	return nil
}

// refuse keeps the current policy instead of p, warning once per policy
// refused.
func (w *Watcher) refuse(p Policy, why error) {
	s := p.String()
	if old := w.refused.Swap(&s); old != nil && *old == s {
		return
	}
	w.log.Warn("timeout policy in Redis not applied; keeping the one in force",
		"refused", s, "err", why, "policy", w.Current().String(),
		"fix", "store a policy every gateway can apply with: gateway policy set")
}

// Run polls until ctx is done.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		// Failures are logged quietly: a Redis outage would otherwise
		// cost a line per poll. The current policy stays in force.
		if err := w.Refresh(ctx); err != nil && ctx.Err() == nil {
			w.fails.Fail(err)
		} else if err == nil {
			w.fails.OK()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
