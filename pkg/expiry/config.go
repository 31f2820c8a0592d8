package expiry

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
)

// Detection modes.
const (
	ModeEvents = "events" // Redis expired keyspace events only: late and lossy, for comparison
	ModeSweep  = "sweep"  // the deadline-index sweep only
	ModeHybrid = "hybrid" // both, into one pipeline (default)
)

// Config is the expiry listener's configuration.
type Config struct {
	Redis redisconn.Config
	Kafka kafka.Config

	// AdminAddr serves /healthz, /readyz and /metrics. Default 127.0.0.1:8082.
	AdminAddr string
	// Pprof serves /debug/pprof/ on the admin listener. Default false:
	// profiles are unauthenticated and cost CPU while they run.
	Pprof bool
	// Mode is events, sweep or hybrid. Default hybrid.
	Mode string
	// SweepInterval is the pause between sweeps of all buckets. Default
	// 200ms: a silent user waits at most about this long past the deadline.
	SweepInterval time.Duration
	// PrefetchInterval is how often the prefetch path reads, of each bucket
	// this replica owns, what is overdue and what falls due within
	// PrefetchAhead, and sets a local timer per entry; a timer that fires
	// is confirmed in Redis (prefetch.go). It finds timeouts within a fire
	// slot of their deadline, and deadlines written inside a window read
	// already within this interval. Default 500ms; 0 turns it off, and the
	// sweep every SweepInterval finds timeouts, as before it.
	PrefetchInterval time.Duration
	// PrefetchAhead is how far past now a window read reaches. Default 1s;
	// at least PrefetchInterval, so the windows meet.
	PrefetchAhead time.Duration
	// FireSlot is the prefetch path's timer resolution: the timers due
	// within one slot are confirmed together, in one round trip. Default
	// 10ms.
	FireSlot time.Duration
	// SafetySweepInterval is the pause between sweeps of all buckets while
	// the prefetch path is on: the sweep then only covers a replica that
	// died until its mark goes stale (its buckets pass to the others), and
	// anything the prefetch path missed. Default 5s.
	SafetySweepInterval time.Duration
	// SweepBatch is the most due entries taken from one bucket per sweep.
	// A sweep that fills a batch runs again at once. Default 256.
	SweepBatch int
	// DedupTTL is how long a produced timeout's dedup key lives. Default 120s.
	DedupTTL time.Duration
	// ProduceTimeout bounds the delivery of one batch to Kafka. Default 10s.
	ProduceTimeout time.Duration
	// SpoolDir is where the spool lives: timeout events that could not be produced
	// wait there, fsynced, until Kafka takes them again. It must outlive a
	// restart of the listener, and no two listeners may share one.
	// Default /var/lib/stillthere/spool.
	SpoolDir string
	// SpoolMaxBytes caps the spool file. Past it the listener stops taking
	// sweep work (the sessions stay in the deadline index) until the
	// spool drains. Default 256 MiB, about a million events.
	SpoolMaxBytes int

	// OutageGrace is how long a timeout waits after users could reach us
	// again, before it is checked once more: a deadline that fell in a
	// blind interval (Redis out of reach, no sweep, a restart that lost
	// data, a clock step, the user's gateway dead) or within the grace
	// after it. Default 75s: a client at the default TTL (60s plus 5s
	// jitter) pings at least once a TTL, and 10s more covers reconnecting
	// to another gateway.
	OutageGrace time.Duration
	// SweepGapMax is the longest time between two complete sweeps, by any
	// listener replica, that is not a blind interval. Default 2s.
	SweepGapMax time.Duration
	// ClockJumpMax is how much further Redis's clock may move than the
	// listener's between two sweeps before it counts as a step. Default 1s.
	ClockJumpMax time.Duration
	// MassExpiryShare and MassExpiryFloor set the mass-expiry brake: when
	// more than MassExpiryShare of the live sessions, and more than
	// MassExpiryFloor, lapse within MassExpiryWindow, the rest of them are
	// held for OutageGrace and checked again before they are produced.
	// Defaults 0.1, 1000 and 10s.
	MassExpiryShare  float64
	MassExpiryFloor  int
	MassExpiryWindow time.Duration
	// MassExpiryReleaseRate paces the brake's releases: at most this many
	// of the timeouts it held are released per second by this replica,
	// in the order they fall due, none before the grace after its
	// deadline. So a storm held for the grace reaches Kafka and the guide
	// consumers as a stream they can take, not in one block. Default 0:
	// each is released at the grace after its own deadline, so a storm is
	// released over the span its deadlines fell in, and the read-ahead's
	// timers take each in its own fire slot. Measured with 5,000 users
	// leaving at once, a pace of 20,000 a second made the last release
	// come seconds later, not smoother: set it only for a downstream that
	// cannot take the storm's own spread.
	MassExpiryReleaseRate int

	// Closing shapes the default segment's stages while no timeout policy
	// is stored: a reminder at the deadline, then a close stage
	// (close-after, default 3m; 0: none) with close-text. The gateways
	// read the same settings; give both the same values.
	Closing policy.Closing
	// PolicyRefresh is how often the stored timeout policy, whose stages
	// the listener schedules, is re-read. Default (and zero) 2s, as the
	// gateways'.
	PolicyRefresh time.Duration

	// Timeline bounds the users' decision timelines this listener appends
	// to (lapses, holds, events), or turns recording off. Default 100
	// entries, 24h, on; give it the gateways' values.
	Timeline timeline.Settings
}

// FallbackPolicy is the timeout policy in force while none is stored. The
// listener grants no TTL, so only its stages matter.
func (c Config) FallbackPolicy() policy.Policy { return policy.Fallback(0, 0, c.Closing) }

// DefaultConfig is the listener's configuration by default: what
// LoadConfig reads from no flags and no environment. Fields whose zero
// value means their default are set to the default all the same.
func DefaultConfig() Config {
	return Config{
		Redis:         redisconn.DefaultConfig(),
		Kafka:         kafka.DefaultConfig(),
		AdminAddr:     "127.0.0.1:8082",
		Mode:          ModeHybrid,
		SweepInterval: 200 * time.Millisecond,
		SweepBatch:    256,
		// Detection within a fire slot of the deadline (bench/report.md).
		PrefetchInterval:    500 * time.Millisecond,
		PrefetchAhead:       time.Second,
		FireSlot:            10 * time.Millisecond,
		SafetySweepInterval: 5 * time.Second,
		DedupTTL:            120 * time.Second,
		ProduceTimeout:      10 * time.Second,
		SpoolDir:            "/var/lib/stillthere/spool",
		SpoolMaxBytes:       256 << 20,
		// A client at the default TTL pings at least once a TTL and its
		// jitter; 10s more covers reconnecting to another gateway.
		OutageGrace:           policy.DefaultSessionTTL + policy.DefaultSessionJitter + 10*time.Second,
		SweepGapMax:           2 * time.Second,
		ClockJumpMax:          time.Second,
		MassExpiryShare:       0.1,
		MassExpiryFloor:       1000,
		MassExpiryWindow:      10 * time.Second,
		MassExpiryReleaseRate: 0,
		Closing:               policy.DefaultClosing(),
		PolicyRefresh:         policy.DefaultRefresh,
		Timeline:              timeline.Settings{Bounds: session.TimelineBounds{Entries: timeline.DefaultEntries, Keep: timeline.DefaultKeep}},
	}
}

// Bind registers the listener's settings on b, with DefaultConfig's
// values as their defaults.
func (c *Config) Bind(b *config.Binder) {
	d := DefaultConfig()
	c.Redis.Bind(b)
	c.Kafka.Bind(b)
	b.String(&c.AdminAddr, "listener-admin-addr", d.AdminAddr, "listen address of health and metrics")
	b.Bool(&c.Pprof, "pprof", d.Pprof, "serve /debug/pprof/ on the admin listener (unauthenticated)")
	b.String(&c.Mode, "detect-mode", d.Mode, "expiry detection: events, sweep or hybrid")
	b.Duration(&c.SweepInterval, "sweep-interval", d.SweepInterval, "pause between sweeps of the deadline index")
	b.Duration(&c.PrefetchInterval, "prefetch-interval", d.PrefetchInterval, "how often owned buckets' next deadlines are read ahead and set as local timers (0: off, the sweep finds timeouts)")
	b.Duration(&c.PrefetchAhead, "prefetch-ahead", d.PrefetchAhead, "how far past now each read-ahead reaches")
	b.Duration(&c.FireSlot, "fire-slot", d.FireSlot, "resolution of the local timers: those due within one slot are confirmed in one round trip")
	b.Duration(&c.SafetySweepInterval, "safety-sweep-interval", d.SafetySweepInterval, "pause between sweeps of all buckets while the read-ahead is on")
	b.Int(&c.SweepBatch, "sweep-batch", d.SweepBatch, "most due sessions taken per bucket per sweep")
	b.Duration(&c.DedupTTL, "dedup-ttl", d.DedupTTL, "lifetime of a produced timeout's dedup key")
	b.Duration(&c.ProduceTimeout, "produce-timeout", d.ProduceTimeout, "timeout of producing a batch to Kafka")
	b.String(&c.SpoolDir, "spool-dir", d.SpoolDir, "directory of the spool that holds events while Kafka is unreachable")
	b.Int(&c.SpoolMaxBytes, "spool-max-bytes", d.SpoolMaxBytes, "size cap of the spool file, bytes")
	b.Duration(&c.OutageGrace, "outage-grace", d.OutageGrace, "how long timeouts that fell in or near a blind interval wait after it, before they are checked again")
	b.Duration(&c.SweepGapMax, "sweep-gap-max", d.SweepGapMax, "longest time between two complete sweeps that is not a blind interval")
	b.Duration(&c.ClockJumpMax, "clock-jump-max", d.ClockJumpMax, "how far Redis's clock may step between two sweeps before it is a blind interval")
	b.Float(&c.MassExpiryShare, "mass-expiry-share", d.MassExpiryShare, "mass-expiry brake: share of live sessions lapsing within the window")
	b.Int(&c.MassExpiryFloor, "mass-expiry-floor", d.MassExpiryFloor, "mass-expiry brake: fewest lapses within the window that can engage it")
	b.Duration(&c.MassExpiryWindow, "mass-expiry-window", d.MassExpiryWindow, "mass-expiry brake: the window lapses are counted in")
	b.Int(&c.MassExpiryReleaseRate, "mass-expiry-release-rate", d.MassExpiryReleaseRate, "mass-expiry brake: most held timeouts released per second by this replica, in the order they fall due (0: each at the grace after its deadline, unpaced)")
	c.Closing.Bind(b)
	b.Duration(&c.PolicyRefresh, "policy-refresh", d.PolicyRefresh, "how often the timeout policy in Redis is re-read")
	c.Timeline.Bind(b)
}

// LoadConfig reads the listener's settings from args and env.
func LoadConfig(args []string, env config.Lookup) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("expiry-listener", flag.ContinueOnError)
	b := config.NewBinder(fs, env)
	c.Bind(b)
	if err := b.Parse(args); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if err := c.Redis.Validate(); err != nil {
		return err
	}
	if err := c.Kafka.Validate(); err != nil {
		return err
	}
	if err := c.Closing.Validate(); err != nil {
		return err
	}
	if err := c.Timeline.Validate(); err != nil {
		return err
	}
	switch {
	case c.AdminAddr == "":
		return errors.New("listener-admin-addr: empty")
	case c.Mode != ModeEvents && c.Mode != ModeSweep && c.Mode != ModeHybrid:
		return fmt.Errorf("detect-mode: %q, want events, sweep or hybrid", c.Mode)
	case c.SweepInterval < 10*time.Millisecond || c.SweepInterval > time.Minute:
		return fmt.Errorf("sweep-interval: %v, want between 10ms and 1m", c.SweepInterval)
	case c.PrefetchInterval != 0 && (c.PrefetchInterval < 10*time.Millisecond || c.PrefetchInterval > 10*time.Second):
		return fmt.Errorf("prefetch-interval: %v, want 0 (off) or between 10ms and 10s", c.PrefetchInterval)
	case c.PrefetchInterval != 0 && 2*c.PrefetchInterval > c.SweepGapMax:
		return fmt.Errorf("prefetch-interval: %v, want at most half of sweep-gap-max (%v): each read-ahead marks the index swept", c.PrefetchInterval, c.SweepGapMax)
	case c.PrefetchInterval != 0 && (c.PrefetchAhead < c.PrefetchInterval || c.PrefetchAhead > time.Minute):
		return fmt.Errorf("prefetch-ahead: %v, want between prefetch-interval (%v) and 1m, so that the windows meet", c.PrefetchAhead, c.PrefetchInterval)
	case c.PrefetchInterval != 0 && (c.FireSlot < time.Millisecond || c.FireSlot > c.PrefetchInterval):
		return fmt.Errorf("fire-slot: %v, want between 1ms and prefetch-interval (%v)", c.FireSlot, c.PrefetchInterval)
	case c.PrefetchInterval != 0 && (c.SafetySweepInterval < 10*time.Millisecond || c.SafetySweepInterval > 10*time.Minute):
		return fmt.Errorf("safety-sweep-interval: %v, want between 10ms and 10m", c.SafetySweepInterval)
	case c.SweepBatch < 1 || c.SweepBatch > 10000:
		return fmt.Errorf("sweep-batch: %d, want between 1 and 10000", c.SweepBatch)
	case c.DedupTTL < time.Minute:
		return fmt.Errorf("dedup-ttl: %v, want at least 1m: it must outlive the minute window", c.DedupTTL)
	case c.ProduceTimeout < time.Second:
		return fmt.Errorf("produce-timeout: %v, want at least 1s", c.ProduceTimeout)
	case c.SpoolDir == "":
		return errors.New("spool-dir: empty")
	case c.SpoolMaxBytes < 64<<10:
		return fmt.Errorf("spool-max-bytes: %d, want at least 65536", c.SpoolMaxBytes)
	case c.OutageGrace < time.Second || c.OutageGrace > 24*time.Hour:
		return fmt.Errorf("outage-grace: %v, want between 1s and 24h", c.OutageGrace)
	case c.SweepGapMax < 2*c.SweepInterval:
		return fmt.Errorf("sweep-gap-max: %v, want at least twice sweep-interval (%v)", c.SweepGapMax, 2*c.SweepInterval)
	case c.ClockJumpMax < 100*time.Millisecond:
		return fmt.Errorf("clock-jump-max: %v, want at least 100ms", c.ClockJumpMax)
	case !(c.MassExpiryShare > 0 && c.MassExpiryShare <= 1):
		return fmt.Errorf("mass-expiry-share: %v, want above 0 and at most 1", c.MassExpiryShare)
	case c.MassExpiryFloor < 1:
		return fmt.Errorf("mass-expiry-floor: %d, want at least 1", c.MassExpiryFloor)
	case c.MassExpiryWindow < time.Second || c.MassExpiryWindow > 10*time.Minute:
		return fmt.Errorf("mass-expiry-window: %v, want between 1s and 10m", c.MassExpiryWindow)
	case c.MassExpiryReleaseRate < 0 || c.MassExpiryReleaseRate > 1_000_000:
		return fmt.Errorf("mass-expiry-release-rate: %d, want between 0 and 1000000", c.MassExpiryReleaseRate)
	case c.PolicyRefresh < 0 || (c.PolicyRefresh > 0 && c.PolicyRefresh < 100*time.Millisecond):
		return fmt.Errorf("policy-refresh: %v, want at least 100ms (0 for the default, 2s)", c.PolicyRefresh)
	}
	return nil
}

// GCPercent is the listener's garbage collector goal, unless the GOGC
// environment variable says otherwise: the heap may grow by twice the
// live heap between collections, where Go's default lets it double. The
// listener's live heap is small (its timers, the batch in hand) and a
// storm of lapses makes garbage fast, so collections would come often
// for little memory; on two cores, a storm's release spent about a
// tenth of its CPU in the collector at the default (bench/report.md,
// step 4). The memory limit TuneGC sets from the container's keeps the
// larger heap inside it.
const GCPercent = 200
