// Command detectbench measures expiry detection on this machine, with many
// live sessions in Redis, in each detection mode side by side in one run:
// how late after its deadline each silent session's timeout event is
// produced and its guide reaches a webhook through the guide consumer,
// and how many are lost or doubled. Then a storm: many sessions running
// out within one second, far more than the listener's mass-expiry brake
// lets through at once; the rest are held for the outage grace and
// checked again, and the storm is timed until every guide is delivered.
//
// Mode sweep is the listener's default: the prefetch path finds timeouts
// by local timers, the sweep only as a safety net; sweep-noprefetch is the
// sweep alone, every sweep interval, as before the prefetch path. Each
// mode runs once per count of -replicas: that many listener replicas,
// sharing the work. Beside the lateness, each run reports Redis's calls
// per second (INFO commandstats): with the listeners idle (nothing due,
// only they and the idle consumer call Redis), and while the silences
// expire (listeners and consumer).
//
// It starts its own redis-server (with expired keyspace events on, as the
// listener would set them) and embedded Kafka, writes the sessions through
// the same script the gateway uses, and runs a listener, a guide consumer
// (webhook sender) and the webhook in process, one set per mode on a
// topic of its own. Event lag is the record's timestamp, taken when the
// listener produces it, minus the session's deadline from Redis's clock;
// guide latency is arrival at the webhook minus the deadline. Both clocks
// are this machine's.
//
// Every listener runs with -grace as its outage grace (short, so that a
// timeout held for it is seen within the run), and no silence is called
// lost before the grace and 5 s more have passed since its deadline,
// whatever -wait says.
//
//	go run ./loadtest/detectbench -live 100000 -silent 1000 -storm 50000
//	go run ./loadtest/detectbench -live 1000000 -modes sweep-noprefetch,sweep -replicas 1,2 -storm 0
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/daemon"
	"github.com/stillthere/stillthere/pkg/expiry"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// ModeResult is one detection mode's figures.
type ModeResult struct {
	Mode       string  `json:"mode"`
	Replicas   int     `json:"replicas"` // listener replicas sharing the work
	Silent     int     `json:"silent"`
	Produced   int     `json:"produced"` // distinct silences with an event
	Lost       int     `json:"lost"`     // silences with no event within the wait
	Duplicates int     `json:"duplicates"`
	LagP50MS   float64 `json:"lag_p50_ms"`
	LagP99MS   float64 `json:"lag_p99_ms"`
	LagMaxMS   float64 `json:"lag_max_ms"`
	WaitS      float64 `json:"wait_s"` // how long after the last deadline events were awaited
	// Held counts timeouts the listener held for the grace, by any rule:
	// none, when nothing looked like an outage.
	Held int `json:"held"`
	// Whole guides, through the consumer to a webhook: arrival there minus
	// the deadline.
	Guided        int     `json:"guided"`
	GuidesDoubled int     `json:"guides_doubled"` // users with two different guides
	GuideP50MS    float64 `json:"guide_p50_ms"`
	GuideP99MS    float64 `json:"guide_p99_ms"`
	GuideMaxMS    float64 `json:"guide_max_ms"`
	// The close stage, CloseAfterS after the reminder: its events (lag
	// from when it was due) and its guides at the webhook (arrival minus
	// when it was due).
	CloseAfterS   float64 `json:"close_after_s"`
	Closed        int     `json:"closed"` // distinct close-stage events
	CloseLagP50   float64 `json:"close_lag_p50_ms"`
	CloseLagP99   float64 `json:"close_lag_p99_ms"`
	CloseLagMax   float64 `json:"close_lag_max_ms"`
	CloseGuided   int     `json:"close_guided"`
	CloseGuideP50 float64 `json:"close_guide_p50_ms"`
	CloseGuideP99 float64 `json:"close_guide_p99_ms"`
	CloseGuideMax float64 `json:"close_guide_max_ms"`
	// Redis's commands per second (INFO commandstats, which counts the
	// commands scripts run too): IdleCallsPerS over IdleS with the
	// listeners running and nothing due (their detection cost alone, and
	// the idle consumer's); ExpiryCallsPerS from the first silent
	// deadline to the last (detection, events, dedup, settling, and the
	// consumer's guides). The Scripts figures count script calls
	// (EVALSHA, EVAL) alone.
	IdleCallsPerS     float64 `json:"idle_calls_per_s"`
	IdleScriptsPerS   float64 `json:"idle_scripts_per_s"`
	IdleS             float64 `json:"idle_s"`
	ExpiryCallsPerS   float64 `json:"expiry_calls_per_s"`
	ExpiryScriptsPerS float64 `json:"expiry_scripts_per_s"`
}

// StormResult is the storm's figures.
type StormResult struct {
	Sessions  int `json:"sessions"`
	WindowMS  int `json:"window_ms"`
	Delivered int `json:"delivered"` // distinct guide ids the webhook took
	Lost      int `json:"lost"`
	Doubled   int `json:"doubled"` // users who got two different guides
	Resent    int `json:"resent"`  // posts of an id already taken (collapsed by Idempotency-Key)
	// AtOnce were delivered before any held timeout could be released
	// (the window's start plus the grace); Held were held by the
	// mass-expiry brake, HeldOther by another rule (none, unless something
	// looked like an outage).
	AtOnce    int     `json:"at_once"`
	Held      int     `json:"held"`
	HeldOther int     `json:"held_other"`
	GraceMS   float64 `json:"grace_ms"`
	// Brake is the listener's mass-expiry setting.
	BrakeFloor  int     `json:"brake_floor"`
	BrakeShare  float64 `json:"brake_share"`
	BrakeWindow string  `json:"brake_window"`
	// AllDeliveredMS is when the last guide arrived, from the window's
	// end; WaitedMS the most the bench would have waited from there.
	AllDeliveredMS float64 `json:"all_delivered_ms"`
	WaitedMS       float64 `json:"waited_ms"`
	// Redis's CPU (user and system, seconds) and commands per storm
	// timeout (scripts' commands included), from the window's start to
	// the last guide; and from the first release (the window's start
	// plus the grace), per held timeout.
	RedisCPUS                   float64 `json:"redis_cpu_s"`
	RedisCallsPerTimeout        float64 `json:"redis_calls_per_timeout"`
	RedisReleaseCPUS            float64 `json:"redis_release_cpu_s"`
	RedisReleaseCallsPerTimeout float64 `json:"redis_release_calls_per_held"`
	// From the first release to the last guide: how long it took, the
	// CPU this process spent (listener, Kafka broker, consumer, webhook),
	// and the share of the machine's cores that were busy (-1: unknown).
	// With Redis's CPU they say whether the release was bound by the
	// machine's cores or waited on something.
	ReleaseMS          float64 `json:"release_ms"`
	ReleaseSelfCPUS    float64 `json:"release_self_cpu_s"`
	ReleaseMachineBusy float64 `json:"release_machine_busy"`
	// The same per half second of the release (as the timeline
	// prints): the median and the busiest; -1 when not read.
	ReleaseBusyMedian float64 `json:"release_machine_busy_median"`
	ReleaseBusyPeak   float64 `json:"release_machine_busy_peak"`
	Cores             int     `json:"cores"`
}

// Report is what detectbench prints.
type Report struct {
	Command string `json:"command"`
	Live    int    `json:"live"`
	// LiveWriteS is how long writing the live sessions took (pipelined
	// renewals), RedisMemoryMB Redis's used_memory once they were.
	LiveWriteS    float64      `json:"live_write_s"`
	RedisMemoryMB float64      `json:"redis_memory_mb"`
	Silent        int          `json:"silent"`
	Modes         []ModeResult `json:"modes"`
	// Timeline is what users' timelines hold after the modes' silences;
	// StormTimeline after the storm's too. Nil with -timeline-off.
	Timeline      *TimelineCost `json:"timeline,omitempty"`
	StormTimeline *TimelineCost `json:"storm_timeline,omitempty"`
	Storm         *StormResult  `json:"storm,omitempty"`
}

// prefix0 is the bench's Redis key prefix.
const prefix0 = "db"

// consumerInFlight is the guide consumer's max-in-flight; 0: its default.
var consumerInFlight int

func main() {
	live := flag.Int("live", 100000, "live sessions held in Redis throughout")
	silent := flag.Int("silent", 1000, "sessions going silent per mode")
	window := flag.Duration("window", 10*time.Second, "the silent sessions' deadlines spread over this")
	modes := flag.String("modes", "sweep,hybrid,events", "detection modes, run one after another: events, sweep, hybrid, or sweep-noprefetch (the sweep alone, as before the prefetch path); empty: the storm alone")
	replicas := flag.String("replicas", "1", "comma-separated counts of listener replicas; each mode runs once per count")
	wait := flag.Duration("wait", 60*time.Second, "how long past the last deadline to wait for events")
	storm := flag.Int("storm", 50000, "sessions running out within one second in the storm; 0 skips it")
	grace := flag.Duration("grace", 10*time.Second, "the listeners' outage grace; silences are awaited at least this plus 5s past their deadline")
	closeAfter := flag.Duration("close-after", 5*time.Second, "each silence's close stage follows its reminder this much later (the lateness of a later stage); 0: one stage only")
	flag.IntVar(&consumerInFlight, "consumer-max-in-flight", 0, "the guide consumer's max-in-flight (0: its default)")
	flag.BoolVar(&timelineOff, "timeline-off", false, "listeners and consumers record no decisions in users' timelines (the figure the timeline's cost is read against)")
	flag.StringVar(&stormProfile, "storm-cpuprofile", "", "write a CPU profile of this process over the storm's window and release to this file")
	flag.StringVar(&stormReleaseProfile, "storm-release-cpuprofile", "", "write a CPU profile of this process from the storm's first release to its last guide to this file (not with -storm-cpuprofile)")
	flag.BoolVar(&stormSlowlog, "storm-slowlog", false, "log every Redis command from the storm's first release (SLOWLOG) and print Redis's time by script")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The listeners and consumers run in this process: its collector is
	// set as their own processes set theirs (the gateway is not here).
	gogc, _ := daemon.TuneGC(expiry.GCPercent)
	fmt.Fprintf(os.Stderr, "detectbench: garbage collector at GOGC=%d, as the listener's and the consumer's\n", gogc)
	rep := Report{Command: "detectbench " + strings.Join(os.Args[1:], " "), Live: *live, Silent: *silent}
	// Never call a silence lost before a timeout held for the grace
	// could have been released, checked and delivered.
	*wait = max(*wait, *grace+minWaitPastGrace)
	var counts []int
	for _, f := range strings.Split(*replicas, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 8 {
			fmt.Fprintf(os.Stderr, "detectbench: -replicas: %q, want counts between 1 and 8\n", f)
			os.Exit(2)
		}
		counts = append(counts, n)
	}
	if err := run(ctx, log, &rep, *grace, *closeAfter, *window, *wait, strings.FieldsFunc(*modes, func(r rune) bool { return r == ',' }), counts, *storm); err != nil {
		fmt.Fprintln(os.Stderr, "detectbench:", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
}

// minWaitPastGrace is how much longer than the grace the bench waits for
// a silence's guide past its deadline: the recheck, produce and send.
const minWaitPastGrace = 5 * time.Second

type bench struct {
	log     *slog.Logger
	redis   *redisserver.Server
	kafka   *kfake.Cluster
	store   *session.Store
	dataDir string
	grace   time.Duration // every listener's outage grace
	// closeAfter is the close stage's delay after the reminder in the
	// modes' runs; the storm runs with one stage.
	closeAfter time.Duration
	idle       *idleReplica // marks the index swept between measurements
	renewers   []*session.Renewer
	rdb        *redis.Client // for INFO
}

// modeSweepNoPrefetch is the sweep alone, every sweep interval: the
// listener with its prefetch path off.
const modeSweepNoPrefetch = "sweep-noprefetch"

// listenerMode is the listener's detect-mode of a bench mode.
func listenerMode(mode string) string {
	if mode == modeSweepNoPrefetch {
		return expiry.ModeSweep
	}
	return mode
}

func run(ctx context.Context, log *slog.Logger, rep *Report, grace, closeAfter, window, wait time.Duration, modes []string, replicas []int, storm int) error {
	rs, err := redisserver.Start(ctx, redisserver.Options{Args: []string{"--maxmemory", "4gb"}})
	if err != nil {
		return err
	}
	defer rs.Close()
	kc, err := kafkatest.NewFake()
	if err != nil {
		return err
	}
	defer kc.Close()
	dir, err := os.MkdirTemp("", "detectbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b := &bench{log: log, redis: rs, kafka: kc, dataDir: dir, grace: grace, closeAfter: closeAfter}
	rdb, err := redisconn.Open(ctx, redisconn.Config{Addrs: []string{rs.Addr}, KeyPrefix: prefix0})
	if err != nil {
		return err
	}
	defer rdb.Close()
	ks, _ := session.NewKeyspace(prefix0)
	b.store = session.NewStore(rdb, ks)
	b.rdb = redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer b.rdb.Close()
	// Renewals in pipelines, as gateways send them: a few batchers at once.
	rctx, stopRenewers := context.WithCancel(ctx)
	var renewing sync.WaitGroup
	defer func() { stopRenewers(); renewing.Wait() }()
	// Their renewals record a hold they cancel, as a gateway's do.
	notes := timeline.Settings{Off: timelineOff}.HoldNotes("gateway", "detectbench")
	for range 4 {
		r := session.NewRenewer(b.store.WithHoldNotes(notes), session.RenewerConfig{MaxBatch: 512})
		b.renewers = append(b.renewers, r)
		renewing.Go(func() { r.Run(rctx) })
	}
	lcfg, err := b.listenerConfig(expiry.ModeHybrid, "idle-replica", 0)
	if err != nil {
		return err
	}
	b.idle = &idleReplica{store: b.store, cfg: lcfg}
	defer b.idle.stop()

	start := time.Now()
	if err := b.renewMany(ctx, "live", rep.Live, func(int) time.Duration { return 30 * time.Minute }); err != nil {
		return err
	}
	rep.LiveWriteS = time.Since(start).Seconds()
	rep.RedisMemoryMB = float64(infoInt(ctx, b.rdb, "memory", "used_memory")) / (1 << 20)
	fmt.Fprintf(os.Stderr, "detectbench: %d live sessions written in %v; Redis uses %.0f MB\n",
		rep.Live, time.Since(start).Round(time.Millisecond), rep.RedisMemoryMB)
	for _, mode := range modes {
		for _, n := range replicas {
			res, err := b.detect(ctx, mode, n, rep.Silent, window, wait)
			if err != nil {
				return fmt.Errorf("mode %s, %d replicas: %w", mode, n, err)
			}
			fmt.Fprintf(os.Stderr, "detectbench: %s, %d replicas: %d of %d produced, %d duplicates, lag p50 %.0f ms p99 %.0f ms max %.0f ms; %d guided, p50 %.0f ms p99 %.0f ms max %.0f ms; %d held; close stage: %d produced, lag p99 %.0f ms, %d guided, p99 %.0f ms; Redis calls/s idle %.0f, while expiring %.0f\n",
				mode, n, res.Produced, res.Silent, res.Duplicates, res.LagP50MS, res.LagP99MS, res.LagMaxMS,
				res.Guided, res.GuideP50MS, res.GuideP99MS, res.GuideMaxMS, res.Held,
				res.Closed, res.CloseLagP99, res.CloseGuided, res.CloseGuideP99, res.IdleCallsPerS, res.ExpiryCallsPerS)
			fmt.Fprintf(os.Stderr, "detectbench: %s, %d replicas: script calls/s idle %.0f, while expiring %.0f\n", mode, n, res.IdleScriptsPerS, res.ExpiryScriptsPerS)
			rep.Modes = append(rep.Modes, res)
		}
	}
	silences := 0
	for _, m := range rep.Modes {
		silences += m.Silent
	}
	if silences > 0 {
		rep.Timeline = timelineCost(ctx, b.rdb, silences)
	}
	if storm > 0 {
		res, err := b.storm(ctx, storm, wait)
		if err != nil {
			return fmt.Errorf("storm: %w", err)
		}
		fmt.Fprintf(os.Stderr, "detectbench: storm: %d of %d delivered, the last %.0f ms after the window; %d at once, %d held by the brake; %d lost, %d doubled\n",
			res.Delivered, res.Sessions, res.AllDeliveredMS, res.AtOnce, res.Held, res.Lost, res.Doubled)
		rep.Storm = res
		rep.StormTimeline = timelineCost(ctx, b.rdb, silences+storm)
	}
	return ctx.Err()
}

// renewMany writes n sessions named name-i with TTL ttl(i), from many
// goroutines through pipelined renewers, as many gateways' renewals would.
func (b *bench) renewMany(ctx context.Context, name string, n int, ttl func(int) time.Duration) error {
	const workers = 1024
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		r := b.renewers[w%len(b.renewers)]
		wg.Go(func() {
			for i := w; i < n; i += workers {
				d := ttl(i)
				if d <= 0 {
					errs <- fmt.Errorf("%s: session %d of %d would be written with a TTL of %v: writing them took too long on this machine", name, i, n, d)
					return
				}
				if _, err := r.Renew(ctx, fmt.Sprintf("%s-%07d", name, i), "default", d, session.ClockPresence); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// env is a lookup over settings given by flag name.
func env(kv map[string]string) config.Lookup {
	return func(name string) (string, bool) {
		for k, v := range kv {
			if config.EnvName(k) == name {
				return v, true
			}
		}
		return "", false
	}
}

func (b *bench) listenerConfig(mode, topic string, closeAfter time.Duration) (expiry.Config, error) {
	prefetch := expiry.DefaultConfig().PrefetchInterval
	if mode == modeSweepNoPrefetch {
		prefetch = 0
	}
	return expiry.LoadConfig(nil, env(map[string]string{
		"prefetch-interval":   prefetch.String(),
		"close-after":         closeAfter.String(),
		"redis-addrs":         b.redis.Addr,
		"key-prefix":          prefix0,
		"kafka-brokers":       b.kafka.ListenAddrs()[0],
		"topic":               topic,
		"listener-admin-addr": "127.0.0.1:0",
		"detect-mode":         listenerMode(mode),
		"spool-dir":           b.dataDir + "/spool-" + topic + "-" + randomSuffix(),
		"outage-grace":        b.grace.String(),
		"timeline-off":        strconv.FormatBool(timelineOff),
	}))
}

// startListener runs a listener until the returned stop is called.
func (b *bench) startListener(ctx context.Context, cfg expiry.Config) (stop func() error, err error) {
	l, err := expiry.Open(ctx, cfg, b.log.With("service", "expiry-listener"))
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	return sync.OnceValue(func() error { l.Close(); return <-done }), nil
}

// idleFor is how long the listeners' own Redis calls are counted, with
// nothing due.
const idleFor = 5 * time.Second

// detect runs one mode: replicas listeners in that mode on a topic of
// their own, silent sessions with deadlines spread over window, and a
// reader of the topic until every silence has its event or wait has
// passed since the last deadline.
func (b *bench) detect(ctx context.Context, mode string, replicas, silent int, window, wait time.Duration) (ModeResult, error) {
	res := ModeResult{Mode: mode, Replicas: replicas, Silent: silent}
	run := fmt.Sprintf("%s-r%d", mode, replicas)
	topic := "detect-" + run
	name := "silent-" + run
	hook, stop, err := b.startGuides(ctx, mode, replicas, topic, name+"-", b.closeAfter)
	if err != nil {
		return res, err
	}
	defer stop()
	time.Sleep(time.Second) // subscribed before the first deadline
	// This mode's listeners have marked sweeps for a second: the idle
	// replica that covered the change of listeners steps aside.
	b.idle.stop()
	calls0, at0 := redisCalls(ctx, b.rdb), time.Now()
	time.Sleep(idleFor) // real time: what the listeners cost while nothing is due
	calls1, at1 := redisCalls(ctx, b.rdb), time.Now()
	res.IdleS = at1.Sub(at0).Seconds()
	res.IdleCallsPerS = float64(calls1.all-calls0.all) / res.IdleS
	res.IdleScriptsPerS = float64(calls1.scripts-calls0.scripts) / res.IdleS
	held0 := heldTotal()

	lead := 2 * time.Second
	if err := b.renewMany(ctx, name, silent, func(i int) time.Duration {
		return lead + window*time.Duration(i)/time.Duration(silent)
	}); err != nil {
		return res, err
	}
	last := time.Now().Add(lead + window)
	firstDeadline := time.Now().Add(lead)
	var expiring struct {
		calls0, calls1 commands
		at0, at1       time.Time
	}
	var counted sync.WaitGroup
	cctx, cancelCount := context.WithCancel(ctx)
	defer cancelCount()
	counted.Go(func() {
		if !sleepCtx(cctx, time.Until(firstDeadline)) {
			return
		}
		expiring.calls0, expiring.at0 = redisCalls(cctx, b.rdb), time.Now()
		if !sleepCtx(cctx, time.Until(last)) {
			return
		}
		expiring.calls1, expiring.at1 = redisCalls(cctx, b.rdb), time.Now()
	})

	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return res, err
	}
	defer cl.Close()
	seen := make(map[string]int)   // stage 1 events per uid
	closed := make(map[string]int) // close-stage events per uid
	var lags, closeLags []float64
	wantClosed := 0
	if b.closeAfter > 0 {
		wantClosed = silent
	}
	record := func(r *kgo.Record) {
		ev, err := timeoutevent.Parse(r.Value)
		if err != nil || !strings.HasPrefix(ev.UID, name+"-") {
			return
		}
		if ev.Stage > 1 {
			closed[ev.UID]++
			if closed[ev.UID] == 1 {
				closeLags = append(closeLags, float64(r.Timestamp.UnixMilli()-ev.DueMS))
			}
			return
		}
		seen[ev.UID]++
		if seen[ev.UID] == 1 {
			lags = append(lags, float64(r.Timestamp.UnixMilli()-ev.DeadlineMS))
		}
	}
	rctx, cancel := context.WithDeadline(ctx, last.Add(wait+b.closeAfter))
	defer cancel()
	for (len(seen) < silent || len(closed) < wantClosed) && rctx.Err() == nil {
		cl.PollFetches(rctx).EachRecord(record)
	}
	// Late duplicates arrive after the last first event, if at all.
	if ctx.Err() == nil {
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		for dctx.Err() == nil {
			cl.PollFetches(dctx).EachRecord(record)
		}
		dcancel()
	}
	counted.Wait()
	if s := expiring.at1.Sub(expiring.at0).Seconds(); s > 0 {
		res.ExpiryCallsPerS = float64(expiring.calls1.all-expiring.calls0.all) / s
		res.ExpiryScriptsPerS = float64(expiring.calls1.scripts-expiring.calls0.scripts) / s
	}
	res.CloseAfterS = b.closeAfter.Seconds()
	res.Closed = len(closed)
	for _, n := range closed {
		res.Duplicates += n - 1
	}
	res.CloseLagP50, res.CloseLagP99, res.CloseLagMax = quantiles(closeLags)
	res.Produced = len(seen)
	res.Lost = silent - len(seen)
	for _, n := range seen {
		res.Duplicates += n - 1
	}
	res.WaitS = wait.Seconds()
	res.LagP50MS, res.LagP99MS, res.LagMaxMS = quantiles(lags)
	// The guides follow their events by milliseconds; give the last ones
	// a moment, then read the webhook.
	for end := time.Now().Add(5 * time.Second); (hook.distinct() < res.Produced || len(hook.laterLags()) < res.Closed) && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	closeGuides := hook.laterLags()
	res.CloseGuided = len(closeGuides)
	res.CloseGuideP50, res.CloseGuideP99, res.CloseGuideMax = quantiles(closeGuides)
	distinct, _, doubled, _ := hook.summary()
	res.Guided, res.GuidesDoubled = distinct, doubled
	res.GuideP50MS, res.GuideP99MS, res.GuideMaxMS = quantiles(hook.guideLags())
	res.Held = heldTotal() - held0
	b.idle.start(ctx) // before this listener stops
	stop()
	return res, nil
}

func quantiles(v []float64) (p50, p99, maxv float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	slices.Sort(v)
	return v[len(v)/2], v[min(len(v)-1, len(v)*99/100)], v[len(v)-1]
}

// startGuides runs replicas listeners in mode producing to topic, a guide
// consumer of topic with the webhook sender, and a webhook that records
// the guides of uids starting with prefix. stop ends them all.
func (b *bench) startGuides(ctx context.Context, mode string, replicas int, topic, prefix string, closeAfter time.Duration) (*webhook, func(), error) {
	hook := newWebhook(prefix)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	srv := serveLean(ln, hook.take)
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	stops = append(stops, srv.Close)
	for range replicas {
		lcfg, err := b.listenerConfig(mode, topic, closeAfter)
		if err != nil {
			stop()
			return nil, nil, err
		}
		stopL, err := b.startListener(ctx, lcfg)
		if err != nil {
			stop()
			return nil, nil, err
		}
		stops = append(stops, func() { stopL() })
	}
	cenv := map[string]string{
		"redis-addrs":         b.redis.Addr,
		"key-prefix":          prefix0,
		"kafka-brokers":       b.kafka.ListenAddrs()[0],
		"topic":               topic,
		"dlq-topic":           topic + "-dlq",
		"consumer-admin-addr": "127.0.0.1:0",
		"consumer-group":      "detectbench-" + topic,
		"sender":              guide.SenderWebhook,
		"webhook-url":         "http://" + ln.Addr().String() + "/guide",
		"webhook-secret":      "detectbench-webhook-secret-0123456789abcdef",
		"timeline-off":        strconv.FormatBool(timelineOff),
	}
	if consumerInFlight > 0 {
		cenv["max-in-flight"] = strconv.Itoa(consumerInFlight)
	}
	ccfg, err := guide.LoadConfig(nil, env(cenv))
	if err != nil {
		stop()
		return nil, nil, err
	}
	c, err := guide.Open(ctx, ccfg, b.log.With("service", "guide-consumer"))
	if err != nil {
		stop()
		return nil, nil, err
	}
	cdone := make(chan error, 1)
	go func() { cdone <- c.Run(ctx) }()
	stops = append(stops, func() { c.Close(); <-cdone })
	return hook, sync.OnceFunc(stop), nil
}

// commands are counts of commands Redis ran so far.
type commands struct {
	all     int64 // every command, those scripts run included
	scripts int64 // script calls: EVALSHA, EVAL
}

// redisCalls reads INFO commandstats; zero when Redis does not answer.
func redisCalls(ctx context.Context, rdb *redis.Client) commands {
	s, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return commands{}
	}
	var n commands
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		c, _ := strconv.ParseInt(v, 10, 64)
		n.all += c
		if name == "cmdstat_evalsha" || name == "cmdstat_eval" {
			n.scripts += c
		}
	}
	return n
}

// infoInt is one integer field of an INFO section, 0 when missing.
func infoInt(ctx context.Context, rdb *redis.Client, section, field string) int64 {
	s, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// sleepCtx waits d, or until ctx is done: false then.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(max(0, d))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// randomSuffix tells apart the spools of listeners on one topic.
func randomSuffix() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
