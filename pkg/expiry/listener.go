// Package expiry is the expiry listener: it finds sessions whose deadline
// passed without a renewal, deduplicates them per uid and minute window,
// and produces one timeout event each to Kafka, keyed by uid.
//
// Paths feed one pipeline. The prefetch path (prefetch.go) reads ahead,
// of the buckets this replica owns, the deadlines of the next moment from
// the index the gateway writes beside each session key, and asks Redis
// about each when its local timer fires: it is on time. The sweep reads
// every bucket of the index, every SweepInterval, or every
// SafetySweepInterval while the prefetch path is on; it loses nothing,
// whoever owns what. Redis expired keyspace events are
// the other: they cost nothing when they come, but come late or never once
// many keys live, and not at all while the listener is disconnected. An
// index entry is removed only after its event is produced, so whatever one
// path misses the sweep finds again.
package expiry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/stillthere/stillthere/pkg/admin"
	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/lifecycle"
	"github.com/stillthere/stillthere/pkg/outage"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/spool"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Listener is an opened expiry listener: Open, then Run, then Close.
type Listener struct {
	runs     lifecycle.Runs // ties Run to Close
	cfg      Config
	log      *slog.Logger
	rdb      redis.UniversalClient
	store    *session.Store
	producer *kgo.Client
	spool    *spool.Spool
	adminLn  net.Listener
	// claim is this listener's dedup claim value, unique per process, so
	// it only ever releases its own claims.
	claim string
	// marker reads the control state: who could not reach us, and when.
	marker *marker
	// brake is the mass-expiry brake; the pipeline goroutine's own.
	brake brake
	// detect is the prefetch path (prefetch.go), nil when it is off or in
	// events mode; the pipeline goroutine's own.
	detect *detector
	// policy keeps the timeout policy in force, for the stages of each
	// silence (see stages.go).
	policy *policy.Watcher
	// timeline records this replica's decisions in users' timelines
	// (timeline.go); nil when off, which records nothing.
	timeline *timeline.Recorder
	// produceDown logs a Kafka outage once, not once per event; the others
	// likewise for Redis (sweeps, event lookups), the topic and the replay.
	produceDown, sweepDown, topicDown, replayDown *outage.Log

	// topicReady is set once the topic is known to exist; until then
	// events go to the spool, so that a broker that creates topics on
	// first use never creates this one with its own defaults.
	topicReady atomic.Bool
	// kafkaErr is the last error of ensuring the topic, for /readyz.
	kafkaErr atomic.Pointer[error]
	// spooled wakes the replayer when the pipeline spools events.
	spooled chan struct{}
	// spoolFull is set while the spool is at its cap and sweeps pause.
	spoolFull atomic.Bool
}

var _ lifecycle.Service = (*Listener)(nil)

// Open connects to Redis and Kafka, opens the spool, creates the topic if
// it is missing, and binds the admin listener. What fails on the way is
// freed by Close.
func Open(ctx context.Context, cfg Config, logger *slog.Logger) (_ *Listener, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("expiry listener config: %w", err)
	}
	id := randomID()
	l := &Listener{
		cfg:     cfg,
		log:     logger,
		claim:   session.DedupClaim(id),
		spooled: make(chan struct{}, 1),
		produceDown: outage.NewLog(logger.With("topic", cfg.Kafka.Topic),
			"produce timeout events (unsent ones are spooled, or left to a replica that can produce)", 0),
		sweepDown:  outage.NewLog(logger, "sweep the deadline index (due sessions wait in it)", 0),
		topicDown:  outage.NewLog(logger.With("topic", cfg.Kafka.Topic), "ensure the kafka topic (timeouts are spooled until it is)", 0),
		replayDown: outage.NewLog(logger.With("topic", cfg.Kafka.Topic), "replay spooled timeouts", 0),
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if l.rdb, err = redisconn.Open(ctx, cfg.Redis); err != nil {
		return nil, err
	}
	if l.producer, err = kafka.NewClient(cfg.Kafka, logger,
		kgo.DefaultProduceTopic(cfg.Kafka.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), // with idempotence, franz-go's default
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(cfg.ProduceTimeout),
	); err != nil {
		return nil, err
	}
	l.store = session.NewStore(l.rdb, cfg.Redis.Keyspace())
	l.timeline = cfg.Timeline.Recorder(l.store, timeline.Config{Service: "listener", Instance: id, Log: logger})
	l.policy = cfg.NewPolicyWatcher(l.rdb, logger)
	// A first read, so that the stages of a stored policy apply from the
	// first sweep; while Redis does not answer, the configured ones do.
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	if err := l.policy.Refresh(pctx); err != nil {
		logger.Debug("read the timeout policy; the configured stages apply until it is read", "err", err)
	}
	pcancel()
	l.marker = &marker{
		store: l.store, rdb: l.rdb, cfg: cfg, id: id, log: logger,
		down:  outage.NewLog(logger, "read the control state from Redis", 0),
		fleet: outage.NewLog(logger, "gateway fleet", 0),
	}
	l.rdb.AddHook(stallHook{&l.marker.stalled})
	if err := redisconn.CheckEviction(ctx, l.rdb); err != nil {
		logger.Warn("Redis may evict session keys; give it maxmemory-policy noeviction", "err", err)
	}
	if l.spool, err = spool.Open(cfg.SpoolDir, int64(cfg.SpoolMaxBytes)); err != nil {
		return nil, fmt.Errorf("spool-dir: %w", err)
	}
	if l.spool.Cut > 0 {
		logger.Error("spool file ended in unreadable bytes (a crash mid-write, or damage); cut them off and kept them aside",
			"bytes", l.spool.Cut, "kept_in", l.spool.CutFile)
	}
	if l.spool.PositionLost != nil {
		logger.Warn("spool could not save its read position and removed it: a restart replays it from the start (the consumer drops events it has seen)", "err", l.spool.PositionLost)
	}
	if n := l.spool.Len(); n > 0 {
		logger.Info("spool holds events from an earlier run; replaying them once Kafka takes them", "events", n, "dir", cfg.SpoolDir)
	}
	l.updateSpoolMetrics()
	// A first try at the topic, so that a normal start produces at once.
	// If Kafka is down, the listener starts anyway, spools, and keeps
	// trying in the replayer.
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l.marker.pingOK.Store(l.ensureTopic(tctx))
	l.marker.sweepsOK.Store(true)
	if cfg.PrefetchInterval > 0 && cfg.Mode != ModeEvents {
		l.detect = newDetector(cfg)
	}
	if l.adminLn, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
		return nil, fmt.Errorf("listen on listener-admin-addr: %w", err)
	}
	return l, nil
}

// Close stops Run if it runs and waits for it (see Run), then frees what
// Open took: Kafka, Redis, the spool and the admin listener. Later calls
// return the first one's error.
func (l *Listener) Close() error {
	return l.runs.Close(func() error {
		if l.producer != nil {
			l.producer.Close()
		}
		var errs []error
		if l.rdb != nil {
			errs = append(errs, l.rdb.Close())
		}
		if l.spool != nil {
			errs = append(errs, l.spool.Close())
		}
		if l.adminLn != nil {
			l.adminLn.Close() // Run's server closed it already, if it ran
		}
		return errors.Join(errs...)
	})
}

// AdminAddr is where health and metrics are served.
func (l *Listener) AdminAddr() net.Addr { return l.adminLn.Addr() }

// Run detects timeouts until ctx is done or Close is called. It returns
// after every goroutine it started has exited; a batch being produced is
// finished first, and other replicas are told this one stopped.
func (l *Listener) Run(ctx context.Context) error {
	ctx, end, err := l.runs.Start(ctx)
	if err != nil {
		return err
	}
	defer end()
	l.log.Info("expiry listener running", "mode", l.cfg.Mode, "admin", l.AdminAddr().String(),
		"topic", l.cfg.Kafka.Topic, "sweep_interval", l.sweepEvery(), "prefetch_interval", l.cfg.PrefetchInterval, "spool", l.cfg.SpoolDir)
	// The timeline's recorder outlives every goroutine that decides, so
	// that stopping flushes the last decisions: it stops after them.
	if l.timeline != nil {
		tctx, stopTimeline := context.WithCancel(context.WithoutCancel(ctx))
		recorded := make(chan struct{})
		go func() { defer close(recorded); l.timeline.Run(tctx) }()
		defer func() { stopTimeline(); <-recorded }()
	}
	eg, ctx := errgroup.WithContext(ctx)
	srv := &http.Server{Handler: admin.NewMux(l.ready, l.cfg.Pprof), ReadHeaderTimeout: 5 * time.Second}
	eg.Go(func() error {
		if err := srv.Serve(l.adminLn); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	eg.Go(func() error {
		<-ctx.Done()
		return srv.Close()
	})

	// Keys from expired events. Bounded: a full channel stalls the
	// subscriber's socket read, it never drops a key.
	expired := make(chan string, 1024)
	if l.cfg.Mode != ModeSweep {
		eg.Go(func() error { return l.followMasters(ctx, expired) })
	}
	eg.Go(func() error { return l.pipeline(ctx, expired) })
	eg.Go(func() error {
		l.policy.Run(ctx)
		return nil
	})
	eg.Go(func() error { return l.replay(ctx) })
	eg.Go(func() error {
		l.marker.markLoop(ctx, l.kafkaPing)
		return nil
	})
	err = eg.Wait()
	// Other replicas stop counting on this one at once.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	l.store.ForgetListener(fctx, l.marker.id)
	cancel()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (l *Listener) ready(ctx context.Context) error {
	if err := l.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if err := l.producer.Ping(ctx); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	if !l.topicReady.Load() {
		err := errors.New("not yet known to exist")
		if p := l.kafkaErr.Load(); p != nil {
			err = *p
		}
		return fmt.Errorf("kafka topic %q: %w", l.cfg.Kafka.Topic, err)
	}
	if l.standby() {
		return errors.New("kafka does not take this replica's events; other replicas take its work")
	}
	return nil
}

// kafkaPing tells whether this replica can produce now.
func (l *Listener) kafkaPing(ctx context.Context) error {
	if !l.topicReady.Load() {
		return errors.New("topic not known to exist")
	}
	return l.producer.Ping(ctx)
}

// listenerFresh is how recently another replica must have marked a sweep
// to count as alive.
func (l *Listener) listenerFresh() time.Duration { return 2*time.Second + 3*l.cfg.SweepInterval }

// othersAlive reports whether another listener replica marked a sweep
// lately, and could produce then, by the last control state.
func (l *Listener) othersAlive() bool {
	c, ok := l.marker.current()
	if !ok {
		return false
	}
	for id, r := range c.Listeners {
		if id != l.marker.id && !r.Failing && c.Now.Sub(r.At) <= l.listenerFresh() {
			return true
		}
	}
	return false
}

// standby reports whether this replica stays out of the work: its produce
// failed lately (or Kafka does not answer it) and another replica is
// alive. A timeout this replica failed to produce is left to another
// (counted in its dedup key), and spooled only by the second replica that
// fails it, or when no other is alive: so one broken replica does not
// spool a share of every timeout while a healthy one could produce it.
func (l *Listener) standby() bool {
	return !l.marker.canProduce() && l.othersAlive()
}

// eventBatch bounds how many expired-event keys are looked up together.
const eventBatch = 256

// sweepEvery is the pause between sweeps of all buckets: the sweep
// interval, or the safety sweep's while the prefetch path finds timeouts.
func (l *Listener) sweepEvery() time.Duration {
	if l.detect != nil {
		return l.cfg.SafetySweepInterval
	}
	return l.cfg.SweepInterval
}

// pipeline is the one goroutine that turns found sessions into events.
// Being one, the sweep, the prefetch path and the events path never race
// on one entry.
func (l *Listener) pipeline(ctx context.Context, expired <-chan string) error {
	// Every mode ticks: without a sweep, the hold set still releases.
	t := time.NewTicker(l.sweepEvery())
	defer t.Stop()
	var readAhead <-chan time.Time
	fire := time.NewTimer(time.Hour)
	fire.Stop()
	defer fire.Stop()
	if l.detect != nil {
		rt := time.NewTicker(l.cfg.PrefetchInterval)
		defer rt.Stop()
		readAhead = rt.C
		l.readAhead(ctx)
	}
	for {
		var fired <-chan time.Time
		if l.detect != nil {
			if at, ok := l.detect.wake(); ok {
				fire.Reset(time.Until(at))
				fired = fire.C
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-readAhead:
			l.readAhead(ctx)
		case <-fired:
			l.fire(ctx)
		case <-t.C:
			if l.cfg.Mode == ModeEvents {
				l.recheckReleased(ctx)
			} else {
				l.sweep(ctx)
			}
		case uid := <-expired:
			uids := []string{uid}
		more:
			for len(uids) < eventBatch {
				select {
				case uid := <-expired:
					uids = append(uids, uid)
				default:
					break more
				}
			}
			l.fromEvents(ctx, uids)
		}
	}
}

// sweep takes due entries from every bucket until none is left or an error
// stops it; the next tick retries.
func (l *Listener) sweep(ctx context.Context) {
	if l.pausedBySpool() || l.standby() {
		return
	}
	start := time.Now()
	defer func() { metricSweepSeconds.Observe(time.Since(start).Seconds()) }()
	for ctx.Err() == nil {
		due, _, err := l.store.Due(ctx, l.cfg.SweepBatch)
		if err != nil {
			l.marker.sweepsOK.Store(false)
			l.sweepDown.Fail(err)
			return
		}
		l.marker.sweepsOK.Store(true)
		metricDue.Set(float64(len(due)))
		// The control state is read after the sweep, so that a blind
		// interval that ended just before it is known.
		c, err := l.marker.mark(ctx)
		if err != nil {
			l.sweepDown.Fail(err)
			return
		}
		l.sweepDown.OK()
		if len(due) == 0 {
			if l.brake.engaged {
				l.braking(ctx, c.Now, nil)
			}
			return
		}
		metricSeen.WithLabelValues(timeoutevent.SourceSweep).Add(float64(len(due)))
		moved, err := l.emit(ctx, c, due, timeoutevent.SourceSweep)
		if err != nil {
			l.sweepDown.Fail(fmt.Errorf("emit %d swept timeouts: %w", len(due), err))
			return
		}
		// Sweep again at once only if a bucket may have more and this
		// round made progress; entries another replica is producing would
		// otherwise be read over and over.
		if len(due) < l.cfg.SweepBatch || moved == 0 {
			return
		}
	}
}

// recheckReleased judges again the timeouts the hold set released (their
// release time came), for a listener in events mode, which does not sweep.
func (l *Listener) recheckReleased(ctx context.Context) {
	if l.pausedBySpool() || l.standby() {
		return
	}
	found, err := l.store.Released(ctx, l.cfg.SweepBatch)
	if err != nil {
		l.sweepDown.Fail(err)
		return
	}
	if len(found) == 0 {
		return
	}
	c, err := l.marker.mark(ctx)
	if err != nil {
		l.sweepDown.Fail(err)
		// Released to the index, where no expired event finds them
		// again: hold them once more, to retry at the next tick.
		release := found[0].Detected.Add(l.cfg.SweepInterval)
		held, err := l.holdEach(ctx, ruleRetry, found, func(session.Expired) time.Time { return release })
		if err != nil {
			l.log.Debug("hold released timeouts again", "count", len(found), "err", err)
		}
		for i, e := range found {
			if held[i] {
				l.noteHeld(e, verdict{act: actHold, rule: ruleRetry, release: release})
			}
		}
		return
	}
	l.sweepDown.OK()
	if _, err := l.emit(ctx, c, found, timeoutevent.SourceEvent); err != nil {
		l.sweepDown.Fail(fmt.Errorf("emit %d released timeouts: %w", len(found), err))
	}
}

func (l *Listener) fromEvents(ctx context.Context, uids []string) {
	if l.pausedBySpool() || l.standby() {
		return // still in the index: the sweep takes them once the spool drains
	}
	var found []session.Expired
	got, ok, errs := l.store.LookupMany(ctx, uids)
	for i := range uids {
		if errs[i] != nil {
			l.sweepDown.Fail(errs[i])
			continue // still in the index: the sweep retries it
		}
		if ok[i] {
			found = append(found, got[i])
		}
	}
	if len(found) == 0 {
		return
	}
	c, err := l.marker.mark(ctx)
	if err != nil {
		return // still in the index: the sweep retries them
	}
	metricSeen.WithLabelValues(timeoutevent.SourceEvent).Add(float64(len(found)))
	if _, err := l.emit(ctx, c, found, timeoutevent.SourceEvent); err != nil {
		l.sweepDown.Fail(fmt.Errorf("emit %d timeouts from events: %w", len(found), err))
	}
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
