package expiry

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/outage"
	"github.com/stillthere/stillthere/pkg/session"
)

// marker makes the sweep mark: it records in Redis that the index is being
// swept and reads the control state (gateway heartbeats, blind intervals,
// which replicas can produce) back. The pipeline marks after every sweep,
// so that its decisions use a state no older than the entries it found;
// markLoop marks between sweeps too, so a long batch is not taken for a
// gap. "Mark" in this package means only this.
type marker struct {
	store *session.Store
	cfg   Config
	id    string // this listener replica
	log   *slog.Logger

	mu       sync.Mutex // serializes marks, so lastSeen and lastSent pair up
	lastSeen time.Time  // Redis's time at this process's last mark
	lastSent time.Time  // local (monotonic) time its request was sent

	cur      atomic.Pointer[session.Control]
	sessions atomic.Int64 // live sessions in the index, refreshed by markLoop
	pingOK   atomic.Bool  // Kafka answered this replica's last ping
	failedAt atomic.Int64 // when a produce last failed here, Unix ns
	// sweepsOK is false while the pipeline's sweeps fail: the loop then
	// does not mark, so that the gap shows (in the swept key, by Redis's
	// clock). Events mode never sweeps.
	sweepsOK atomic.Bool
	seen     map[string]time.Time // blind intervals logged, by member; loop's own
	down     *outage.Log          // marks failing: Redis out of reach
	fleet    *outage.Log          // no gateway instance alive
	rdb      redis.UniversalClient
	restarts restarts // loop's own
	// resets counts the marks that found a blind interval of everyone (a
	// gap, a Redis restart or failover, lost data, a clock step) not seen
	// before: what the prefetch path read of Redis before it may be out of
	// date, so it reads again. Whichever replica's mark found it: the
	// first mark after a restart records it, and every other replica's
	// marks only read it.
	resets atomic.Int64
	// blindKnown are the blind intervals of everyone in the last control
	// state read, by member; under mu.
	blindKnown map[blindKey]bool
	// stalls are this replica's own stalls whose wait is not over (see
	// stall.go), by Redis's clock, each apart; under mu.
	stalls []session.BlindInterval
	// stalled are the round trips to Redis that stalled since the last
	// mark that placed them, by this host's clock.
	stalled stallWindow
}

// blindKey tells blind intervals apart.
type blindKey struct {
	start, end int64 // Unix ms
	reason     string
}

var errNotSwept = errors.New("the sweep fails: not marked")

// restartCheckEvery is how often the masters' run ids are read.
const restartCheckEvery = time.Second

// keepControl is how long blind intervals and dead gateway instances are
// kept in Redis after they end: longer than any hold they cause.
func (m *marker) keepControl() time.Duration {
	return max(time.Hour, 2*m.cfg.OutageGrace)
}

// keepInstances is how long a dead gateway instance is remembered: past
// the longest TTL plus the grace, no deadline of its users can be held.
func (m *marker) keepInstances() time.Duration { return 24*time.Hour + m.cfg.OutageGrace }

// mark records a sweep and returns the control state. It also notices a
// step in Redis's clock: between two marks, Redis's clock moved more than
// ClockJumpMax further than the listener's could have. Redis read its
// clock somewhere between a mark's request and its reply, so the
// listener's time is counted from the last mark's request to this one's
// reply: a Redis that was paused (its clock ran on, the listener's too),
// or a mark that rode in a pipeline with reads that hung after Redis
// answered it, is not taken for a step. The state carries this replica's
// own stall, if one is recent (see stall.go).
func (m *marker) mark(ctx context.Context) (session.Control, error) {
	return m.markVia(ctx, m.store.Mark)
}

// markVia is mark, with the mark itself made by do: the prefetch path's
// pipelines carry it after their reads (prefetch.go).
func (m *marker) markVia(ctx context.Context, do func(context.Context, session.SweepMark) (session.Control, error)) (session.Control, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sent := time.Now()
	c, err := do(ctx, session.SweepMark{
		GapMax:   m.cfg.SweepGapMax,
		LastSeen: m.lastSeen,
		Keep:     m.keepControl(),
		Listener: m.id,
		Failing:  !m.canProduce(),
	})
	at := time.Now()
	if err != nil {
		m.down.Fail(err)
		return session.Control{}, err
	}
	m.down.OK()
	if !m.lastSent.IsZero() {
		if jump := c.Now.Sub(m.lastSeen) - at.Sub(m.lastSent); jump > m.cfg.ClockJumpMax {
			b := session.BlindInterval{Start: m.lastSeen, End: c.Now, Reason: session.BlindClockJump}
			if err := m.store.RecordBlind(ctx, b); err != nil {
				m.down.Fail(err)
				return session.Control{}, err // not marked: the next mark finds the step again
			}
			c.Gap = &b
			c.Blind = append(c.Blind, b)
		}
	}
	if c.Gap != nil {
		metricBlind.WithLabelValues(c.Gap.Reason).Inc()
	}
	m.lastSeen, m.lastSent = c.Now, sent
	cur := c
	m.cur.Store(&cur)
	if m.newBlind(c.Blind) {
		m.resets.Add(1)
	}
	if at.Sub(sent) <= stallMin {
		// Redis's clock in c is near enough at's to place the stalls
		// seen since; a mark that stalled itself leaves them to the next.
		m.placeStalls(c.Now, at)
	}
	// This replica's own, for every judgement until their wait is over:
	// not recorded, and not in the state other callers read (current).
	m.stalls = slices.DeleteFunc(m.stalls, func(b session.BlindInterval) bool { return !c.Now.Before(b.End.Add(stallSettle)) })
	c.Blind = append(slices.Clip(c.Blind), m.stalls...)
	return c, nil
}

// newBlind reports whether blind holds a blind interval of everyone that
// the last control state did not, and remembers blind's. Under mu.
func (m *marker) newBlind(blind []session.BlindInterval) bool {
	known := make(map[blindKey]bool, len(m.blindKnown))
	found := false
	for _, b := range blind {
		if b.Scope != "" {
			continue
		}
		k := blindKey{b.Start.UnixMilli(), b.End.UnixMilli(), b.Reason}
		known[k] = true
		found = found || !m.blindKnown[k]
	}
	m.blindKnown = known
	return found
}

// probeAfter is how long a replica whose produce failed stays out of the
// work before it tries again: Kafka may answer pings and still refuse
// records.
const probeAfter = 5 * time.Second

// canProduce reports whether this replica takes work it must produce:
// Kafka answers its pings and no produce failed lately.
func (m *marker) canProduce() bool {
	return m.pingOK.Load() && time.Since(time.Unix(0, m.failedAt.Load())) > probeAfter
}

// produceFailed notes that Kafka did not take this replica's events.
func (m *marker) produceFailed() { m.failedAt.Store(time.Now().UnixNano()) }

// current is the last control state read, if any.
func (m *marker) current() (session.Control, bool) {
	c := m.cur.Load()
	if c == nil {
		return session.Control{}, false
	}
	return *c, true
}

// markLoop marks every sweep interval until ctx is done, and now and then
// counts the live sessions (for the brake) and forgets long-dead gateway
// instances. It logs each new blind interval once.
func (m *marker) markLoop(ctx context.Context, kafkaPing func(context.Context) error) {
	t := time.NewTicker(m.cfg.SweepInterval)
	defer t.Stop()
	var lastCount, lastPing, lastRestart time.Time
	for {
		if time.Since(lastPing) >= time.Second {
			lastPing = time.Now()
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			m.pingOK.Store(kafkaPing(pctx) == nil)
			cancel()
		}
		var c session.Control
		err := errNotSwept
		if m.sweepsOK.Load() {
			mctx, cancel := context.WithTimeout(ctx, max(time.Second, 5*m.cfg.SweepInterval))
			c, err = m.mark(mctx)
			cancel()
		}
		if err == nil && time.Since(lastRestart) >= restartCheckEvery {
			lastRestart = time.Now()
			restarted := m.restarts.check(ctx, m.rdb, m.store, c.Now)
			if len(restarted) > 0 {
				m.resets.Add(1)
			}
			for _, addr := range restarted {
				metricBlind.WithLabelValues(session.BlindRestart).Inc()
				m.log.Warn("Redis restarted; timeouts around the restart wait for the grace", "master", addr)
			}
		}
		if err == nil {
			m.report(c)
			if time.Since(lastCount) >= 5*time.Second {
				lastCount = time.Now()
				if n, err := m.store.Sessions(ctx); err == nil {
					m.sessions.Store(n)
				}
				if err := m.store.PruneInstances(ctx, c, m.keepInstances()); err != nil && ctx.Err() == nil {
					m.log.Debug("forget dead gateway instances", "err", err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// report logs blind intervals not seen before, and gateway fleet outages.
func (m *marker) report(c session.Control) {
	if m.seen == nil {
		m.seen = map[string]time.Time{}
	}
	for _, b := range c.Blind {
		// A gateway's drain is recorded again every heartbeat while it
		// lasts: one line per drain, when it is first seen.
		key := b.Start.String() + b.Scope + b.Reason
		if b.Reason != session.BlindDrain {
			key += b.End.String()
		}
		_, ok := m.seen[key]
		if !ok || b.End.After(m.seen[key]) {
			m.seen[key] = b.End
		}
		if ok {
			continue
		}
		if c.Now.Sub(b.End) > m.cfg.OutageGrace {
			continue // old news, from before this process started
		}
		attrs := []any{"reason", b.Reason, "from", b.Start.UTC().Format(time.RFC3339Nano),
			"to", b.End.UTC().Format(time.RFC3339Nano), "lasted", b.End.Sub(b.Start).Round(time.Millisecond),
			"grace", m.cfg.OutageGrace}
		if b.Scope != "" {
			attrs = append(attrs, "gateway", b.Scope)
		}
		if b.Reason == session.BlindDrain {
			// Routine: a rolling restart drains every instance in turn.
			m.log.Info("gateway instance draining; its users' timeouts wait for the grace after the drain, then are checked again", attrs...)
			continue
		}
		m.log.Warn("users could not reach us for a while; timeouts with deadlines in it wait for the grace, then are checked again", attrs...)
	}
	for key, end := range m.seen {
		if c.Now.Sub(end) > m.keepControl() {
			delete(m.seen, key)
		}
	}
	since, down := fleetDown(c)
	metricFleetDown.Set(b2f(down))
	metricActivityWatermarkLag.Set(activityLag(c).Seconds())
	if down {
		m.fleet.Fail(errFleetDown{since})
	} else {
		m.fleet.OK()
	}
}

type errFleetDown struct{ since time.Time }

func (e errFleetDown) Error() string {
	return "no gateway instance is alive since " + e.since.UTC().Format(time.RFC3339Nano) + "; holding every timeout since"
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
