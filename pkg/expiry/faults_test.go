package expiry

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// listenerProcessEnv makes the test binary run a listener from the
// STILLTHERE_* environment instead of the tests, so that a test can kill
// it with SIGKILL.
const listenerProcessEnv = "STILLTHERE_TEST_LISTENER_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(listenerProcessEnv) == "1" {
		cfg, err := LoadConfig(nil, os.LookupEnv)
		var l *Listener
		if err == nil {
			l, err = Open(context.Background(), cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		}
		if err == nil {
			err = l.Run(context.Background())
			l.Close()
		}
		fmt.Fprintln(os.Stderr, "listener process:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// env is cfg as the STILLTHERE_* variables a listener process reads.
func env(cfg Config) []string {
	kv := map[string]string{
		"redis-addrs":         cfg.Redis.Addrs[0],
		"key-prefix":          cfg.Redis.KeyPrefix,
		"kafka-brokers":       cfg.Kafka.Brokers[0],
		"topic":               cfg.Kafka.Topic,
		"topic-partitions":    fmt.Sprint(cfg.Kafka.Partitions),
		"listener-admin-addr": cfg.AdminAddr,
		"detect-mode":         cfg.Mode,
		"sweep-interval":      cfg.SweepInterval.String(),
		"produce-timeout":     cfg.ProduceTimeout.String(),
		"spool-dir":           cfg.SpoolDir,
		"spool-max-bytes":     fmt.Sprint(cfg.SpoolMaxBytes),
		// The stages of cfg: one reminder, unless it says a close.
		"close-after": cfg.Closing.After.String(),
	}
	out := append(os.Environ(), listenerProcessEnv+"=1")
	for k, v := range kv {
		out = append(out, config.EnvName(k)+"="+v)
	}
	return out
}

// silentOver renews n sessions whose deadlines spread evenly over span,
// starting about from.
func (h *harness) silentOver(name string, n int, from, span time.Duration) map[string]grant {
	want := make(map[string]grant, n)
	for i := range n {
		uid := fmt.Sprintf("%s-%04d", name, i)
		want[uid] = h.renew(uid, "default", from+span*time.Duration(i)/time.Duration(n))
	}
	return want
}

// lastDeadline is the latest deadline of grants.
func lastDeadline(grants map[string]grant) time.Time {
	var last time.Time
	for _, g := range grants {
		if g.deadline.After(last) {
			last = g.deadline
		}
	}
	return last
}

// checkCollapsible checks that every uid of want has an event, that no
// other uid has one, and that any duplicates carry the same id, which
// downstream collapses. It returns the number of duplicates.
func checkCollapsible(t *testing.T, evs []timeoutevent.Event, want map[string]grant) int {
	t.Helper()
	dups := 0
	got := byUID(evs)
	for uid, g := range want {
		if len(got[uid]) == 0 {
			t.Errorf("no event for %s", uid)
		}
		for _, ev := range got[uid] {
			checkEvent(t, ev, g, sourcesOf(ModeHybrid)...)
		}
		dups += max(0, len(got[uid])-1)
	}
	for uid := range got {
		if _, ok := want[uid]; !ok {
			t.Errorf("event for %s, which never went silent", uid)
		}
	}
	return dups
}

// TestListenerDown: sessions that run out while the only listener is
// stopped are all produced, once each, after it starts again.
func TestListenerDown(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeHybrid)
	stop := h.start(cfg)
	h.waitSubscribed(1)

	want := h.silentOver("user", 200, 300*time.Millisecond, 8*time.Second)
	waitFor(t, waitLong, "the first silences to be produced", func() bool { return h.produced() > 0 })
	stop()
	before := h.produced()
	h.untilRedis(lastDeadline(want)) // the rest run out meanwhile, unheard
	if before >= int64(len(want)) {
		t.Fatalf("%d events before the outage; the test needs sessions to run out during it", before)
	}

	stop = h.start(cfg)
	h.waitProduced(len(want))
	h.waitSettled(slices.Collect(maps.Keys(want)))
	stop()
	checkExactlyOnce(t, h.events(), want, sourcesOf(ModeHybrid)...)
	t.Logf("%d of %d produced before the listener stopped", before, len(want))
}

// TestListenerKilled: a listener killed with SIGKILL in the middle of its
// work, down while the rest run out, loses nothing: after a restart every silence is
// produced, and a batch produced but not yet settled at the kill is
// produced again, once its claim lapses, with the same event id.
func TestListenerKilled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeHybrid)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = env(cfg)
	cmd.Stderr = os.Stderr
	if !testing.Verbose() {
		cmd.Stderr = nil
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	h.waitSubscribed(1)

	// Deadlines every 5 ms or so: the kill lands in the middle of a batch.
	want := h.silentOver("user", 600, 200*time.Millisecond, 3*time.Second)
	waitFor(t, waitLong, "the listener process to produce", func() bool { return h.produced() > 100 })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	before := h.produced()
	h.untilRedis(lastDeadline(want)) // the rest run out meanwhile, unheard

	stop := h.start(cfg) // the same spool directory, unlocked by the kill
	// A batch claimed at the kill waits out its claim (30 s) first, both
	// to be produced and to leave the index: the count of events may be
	// reached sooner, by duplicates of timeouts produced at the kill and
	// not yet marked so.
	uids := slices.Collect(maps.Keys(want))
	waitFor(t, 2*waitLong+10*time.Second, "every silence to be produced and its entry settled", func() bool {
		if h.produced() < int64(len(want)) {
			return false
		}
		for _, uid := range uids {
			if h.inIndex(uid) {
				return false
			}
		}
		return true
	})
	h.waitSettled(uids)
	stop()
	dups := checkCollapsible(t, h.events(), want)
	t.Logf("%d of %d produced before the kill; %d duplicates, each with its original's id", before, len(want), dups)
}

// TestKafkaOutageSpools: with Kafka unavailable the listener spools what
// runs out, restarts in the middle of the outage with the
// spool intact, and once Kafka is back replays the spool in order and
// truncates it: every silence produced exactly once.
func TestKafkaOutageSpools(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeHybrid)
	l, stop := h.startListener(cfg)
	h.waitSubscribed(1)

	outage := h.kafka.Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce},
		Topic: testTopic,
		Err:   kerr.NotEnoughReplicas,
		Count: -1,
	})
	live := h.stayLive(3)
	want := h.silentOver("user", 300, 200*time.Millisecond, 6*time.Second)
	first := h.silentOver("early", 50, 100*time.Millisecond, 500*time.Millisecond)
	spoolLen := func() int { return l.spool.Len() }
	waitFor(t, waitLong, "the first silences to be spooled", func() bool { return spoolLen() >= len(first) })
	stop() // a restart during the outage: the spool must survive it
	if n := h.produced(); n != 0 {
		t.Fatalf("%d events produced while Kafka was down", n)
	}
	l, stop = h.startListener(cfg)
	maps.Copy(want, first)
	waitFor(t, waitLong, "every silence to be spooled", func() bool { return spoolLen() == len(want) })
	// A batch is spooled, then its index entries settled: they go
	// within a sweep or so.
	waitFor(t, 5*time.Second, "spooled silences to leave the deadline index", func() bool {
		for uid := range want {
			if h.inIndex(uid) {
				return false
			}
		}
		return true
	})
	// Sweeps go on while the spool holds events: one more, and still
	// nothing reaches Kafka.
	h.sweptPast(h.redisNow())
	if n := h.produced(); n != 0 {
		t.Fatalf("%d events produced while Kafka was down", n)
	}
	outage.Remove()

	h.waitProduced(len(want))
	h.waitSettled(slices.Collect(maps.Keys(want)))
	waitFor(t, waitLong, "the spool to be truncated", func() bool { return spoolLen() == 0 })
	stop()
	checkExactlyOnce(t, h.events(), want, sourcesOf(ModeHybrid)...)
	h.checkLive(live)
	fi, err := os.Stat(filepath.Join(cfg.SpoolDir, "spool.log"))
	if err != nil || fi.Size() != 0 {
		t.Errorf("spool file after replay: %v, %v; want it empty", fi, err)
	}
}

// TestSpoolFull: a spool at its cap stops the listener taking new work
// rather than dropping it: the sessions beyond it stay in the deadline
// index, and all are produced, once each, when Kafka comes back.
func TestSpoolFull(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeHybrid)
	cfg.SpoolMaxBytes = 64 << 10 // about 400 events
	l, stop := h.startListener(cfg)
	h.waitSubscribed(1)
	outage := h.kafka.Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce},
		Topic: testTopic,
		Err:   kerr.UnknownServerError,
		Count: -1,
	})
	want := h.silentOver("user", 800, 200*time.Millisecond, time.Second)
	waitFor(t, waitLong, "the spool to fill", func() bool { return l.spoolFull.Load() })
	// Sweeps meanwhile must leave the rest alone. Real time must pass: a
	// paused listener shows nothing of the sweeps it skips, so the test
	// gives them a while, every deadline past, to do wrong.
	h.untilRedis(lastDeadline(want))
	time.Sleep(time.Second)
	spooled := l.spool.Len()
	inIndex := 0
	for uid := range want {
		if h.inIndex(uid) {
			inIndex++
		}
	}
	if spooled+inIndex != len(want) || inIndex == 0 {
		t.Fatalf("with a full spool: %d spooled and %d in the index, want %d in all, some in the index", spooled, inIndex, len(want))
	}
	outage.Remove()
	h.waitProduced(len(want))
	h.waitSettled(slices.Collect(maps.Keys(want)))
	stop()
	checkExactlyOnce(t, h.events(), want, sourcesOf(ModeHybrid)...)
	t.Logf("spool held %d, index %d when full", spooled, inIndex)
}

// TestClusterFailover: a cluster master killed while sessions run out, and
// its replica promoted, loses none of them; the listener subscribes to the
// promoted master and hears its expired events.
func TestClusterFailover(t *testing.T) {
	for _, mode := range []string{ModeHybrid, ModeEvents} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := newClusterHarness(t, true)
			ctx := context.Background()
			stop := h.start(h.config(mode))
			h.waitSubscribed(1)

			want := h.silentOver("before", 300, 500*time.Millisecond, 3*time.Second)
			// The replicas have every write before the crash: what a
			// crash loses before replication is Redis's to lose.
			err := h.rdb.(*redis.ClusterClient).ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
				return node.Wait(ctx, 1, 5*time.Second).Err()
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := h.cluster.Failover(ctx, 1); err != nil {
				t.Fatal(err)
			}
			h.waitSubscribed(1) // on the promoted master too
			// The test's own client, like a gateway's, learns the new slot
			// map on its next reload.
			cc := h.rdb.(*redis.ClusterClient)
			cc.ReloadState(ctx)
			waitFor(t, waitLong, "the test's client to reach every bucket", func() bool {
				for b := range 64 {
					if cc.Set(ctx, h.store.Keyspace().IndexKey(b)+":probe", 1, time.Second).Err() != nil {
						cc.ReloadState(ctx)
						return false
					}
				}
				return true
			})
			after := h.silentOver("after", 100, 200*time.Millisecond, time.Second)
			if mode == ModeEvents {
				// Events alone lose what expires around the crash, which
				// is why hybrid is the default; what expires after it
				// must be heard from the promoted master.
				waitFor(t, waitLong, "events of the sessions silent after the failover", func() bool {
					got := byUID(h.events())
					for uid := range after {
						if len(got[uid]) == 0 {
							return false
						}
					}
					return true
				})
				stop()
				got := byUID(h.events())
				for uid, g := range after {
					if len(got[uid]) != 1 {
						t.Errorf("%d events for %s, want 1", len(got[uid]), uid)
						continue
					}
					checkEvent(t, got[uid][0], g, timeoutevent.SourceEvent)
				}
				heard := 0
				for uid := range want {
					heard += len(got[uid])
				}
				t.Logf("events mode heard %d of the %d silences around the failover", heard, len(want))
				return
			}
			maps.Copy(want, after)
			h.waitProduced(len(want))
			h.waitSettled(slices.Collect(maps.Keys(want)))
			stop()
			checkExactlyOnce(t, h.events(), want, sourcesOf(mode)...)
		})
	}
}

// TestManySessions: with 20,000 live sessions in the deadline index and
// 500 running out over 2 s, each of the 500 is produced exactly once and
// no live one is touched. Lag figures are logged, not asserted: timing
// goals belong to the benchmark (make bench).
func TestManySessions(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const liveN = 20000
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < liveN; i += 8 {
				if _, err := h.store.Renew(context.Background(), fmt.Sprintf("live-%05d", i), "default", 5*time.Minute, session.ClockPresence); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	stop := h.start(h.config(ModeHybrid))
	h.waitSubscribed(1)
	want := h.silentOver("user", 500, 300*time.Millisecond, 2*time.Second)
	h.waitProduced(len(want))
	h.waitSettled(slices.Collect(maps.Keys(want)))
	stop()
	evs := h.events()
	checkExactlyOnce(t, evs, want, sourcesOf(ModeHybrid)...)
	lags := make([]time.Duration, 0, len(evs))
	for _, ev := range evs {
		lags = append(lags, time.Duration(ev.DetectedMS-ev.DeadlineMS)*time.Millisecond)
	}
	slices.Sort(lags)
	t.Logf("deadline to detection with %d live sessions: p50 %v, p99 %v, max %v",
		liveN, lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1])
	if n, err := h.rdb.ZCard(context.Background(), h.store.Keyspace().IndexKey(0)).Result(); err != nil || n == 0 {
		t.Errorf("deadline index bucket 0 after the test: %d entries, %v; want the live sessions' entries kept", n, err)
	}
}
