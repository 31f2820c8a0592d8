package expiry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
)

// Attacks on the gateway's watch of the Redis masters' run ids: a master
// whose run id changed restarted, and the resync hands over as lapsed the
// grants that ran out since it started, by its uptime. The uptime of the
// run read is not when the data went: the master may have been down (or
// hung) before it started again, and it may have started more than once
// since the last look. A silence that fell due in between was never
// guided (the master holding it was down, or up and empty), and nothing
// restores it.

// restartsRig is a cluster harness with one gateway, silent users on the
// master that restarts (the victim), and one elsewhere, on the master
// that holds the heartbeat (control), which shows the listener guides.
type restartsRig struct {
	h       *harness
	gw      *attackGateway
	opened  time.Time // just before the gateway opened
	victim  int
	control int
	on      []string // silent users whose sessions live on the victim
	off     string   // a silent user elsewhere
	ctl     *redis.Client
}

// newRestartsRig opens the gateway; with align, at the start of a second
// of the clock.
func newRestartsRig(t *testing.T, ttl, heartbeat time.Duration, align bool) *restartsRig {
	h := newClusterHarness(t, false)
	if align {
		// Real time must pass for the clock to reach the next second.
		time.Sleep(time.Second - frac(time.Now()))
	}
	opened := time.Now()
	gw := h.startAttackGateway(h.cluster.Addrs()[0], ttl, func(c *gateway.Config) {
		c.Redis.Addrs, c.Redis.Cluster = h.cluster.Addrs(), true
		c.HeartbeatInterval = heartbeat
	})
	r := &restartsRig{h: h, gw: gw, opened: opened}
	ks := h.store.Keyspace()
	r.control = r.owner(ks.RunIDKey())
	if a := r.owner(ks.AliveKey()); a != r.control {
		t.Fatalf("the heartbeat's key is on master %d, the run id key's on %d", a, r.control)
	}
	if b := r.owner(ks.BlindKey()); b != r.control {
		t.Fatalf("the blind intervals' key is on master %d, the heartbeat's on %d", b, r.control)
	}
	r.victim = (r.control + 1) % len(h.cluster.Masters)
	for i := 0; len(r.on) < 2 || r.off == ""; i++ {
		uid := fmt.Sprintf("silent-%d", i)
		switch r.owner(ks.SessionKey(uid)) {
		case r.victim:
			if len(r.on) < 2 {
				r.on = append(r.on, uid)
			}
		case r.control:
			if r.off == "" {
				r.off = uid
			}
		}
	}
	// Redis's clock, read off the master that never goes down.
	r.ctl = redis.NewClient(&redis.Options{Addr: h.cluster.Masters[r.control].Addr})
	t.Cleanup(func() { r.ctl.Close() })
	return r
}

func (r *restartsRig) owner(key string) int {
	r.h.t.Helper()
	ctx := context.Background()
	slot, err := r.h.rdb.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		r.h.t.Fatal(err)
	}
	i, err := r.h.cluster.SlotOwner(ctx, int(slot))
	if err != nil {
		r.h.t.Fatal(err)
	}
	return i
}

// run is master i's run id and uptime, as INFO says.
func (r *restartsRig) run(i int) string {
	c := redis.NewClient(&redis.Options{Addr: r.h.cluster.Masters[i].Addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return err.Error()
	}
	return redisconn.InfoField(info, "run_id") + " up " + redisconn.InfoField(info, "uptime_in_seconds") + "s"
}

// now is Redis's clock, off the control master.
func (r *restartsRig) now() time.Time {
	r.h.t.Helper()
	now, err := r.ctl.Time(context.Background()).Result()
	if err != nil {
		r.h.t.Fatal(err)
	}
	return now
}

// serving waits until the victim serves its slots again (empty).
func (r *restartsRig) serving() {
	r.h.t.Helper()
	ctx := context.Background()
	key := r.h.store.Keyspace().SessionKey(r.on[0])
	waitFor(r.h.t, waitLong, "the restarted master serving its slots", func() bool {
		return r.h.rdb.Exists(ctx, key).Err() == nil
	})
	if n := r.h.rdb.Exists(ctx, key).Val(); n != 0 {
		r.h.t.Fatalf("%s's session outlived a restart without data", r.on[0])
	}
}

// resynced waits until the gateway's resync after the restart it saw has
// recorded the outage it follows (a BlindGateway interval), then until a
// sweep after that interval's grace: whatever the resync restored has
// been guided by then. It returns the interval.
func (r *restartsRig) resynced() session.BlindInterval {
	h := r.h
	h.t.Helper()
	var got session.BlindInterval
	waitFor(h.t, waitLong, "the gateway's resync after the restart", func() bool {
		for _, b := range h.blindList(context.Background()) {
			if b.Reason == session.BlindGateway {
				got = b
				return true
			}
		}
		return false
	})
	// A grant restored at its deadline in the interval is held until the
	// grace after it; one second more for the resync's batch to land.
	h.sweptPast(got.End.Add(testGrace + time.Second))
	return got
}

// frac is the part of t past its whole second.
func frac(t time.Time) time.Duration { return time.Duration(t.UnixNano() % int64(time.Second)) }

// TestAttackRestartsUptimeSecondsGuidesTwice: a silent user's deadline
// falls a moment before a cluster master restarts empty, in the same
// second of the clock; the listener guides the silence, then the master
// crashes and comes back without its data (the renewal Redis remembered
// with it). Redis counts its uptime from its start rounded down to the
// whole second (uptime_in_seconds is the current second less the start's
// second), so the gateway's "uptime back from after the read" puts the
// start up to a second before the real one, not at or after it: the
// guided deadline falls after that start, the grant is handed over as
// lapsed, Redis knows nothing of the user, and the silence is restored and
// guided a second time. One silence must get one guide.
func TestAttackRestartsUptimeSecondsGuidesTwice(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second // whole seconds: the deadline's place in its second is the ping's
	r := newRestartsRig(t, ttl, time.Second, true)
	h := r.h
	// The gateway looks at the run ids every second from when it started
	// running: at the same place in each second (its phase).
	phase := frac(time.Now())
	stop := h.start(h.config(ModeSweep))
	defer stop()
	ctx := context.Background()

	// The deadline a little after the look's place in its second, with
	// room after it in the same second for the guide and the restart.
	want := phase + 120*time.Millisecond
	if want > 600*time.Millisecond {
		t.Skipf("the gateway looks at %v into each second: too late in it to show the case", phase)
	}
	ks := h.store.Keyspace()
	var uid string
	var deadline time.Time
	for i := 0; deadline.IsZero(); i++ {
		if i == 10 {
			t.Skip("no deadline came where it was wanted in its second: this machine is too slow to show the case")
		}
		// Connect at the place in the second that gives the deadline wanted:
		// real time must pass for the clock to get there.
		time.Sleep((want - 20*time.Millisecond - frac(time.Now()) + time.Second) % time.Second)
		var cand string
		for j := 0; cand == ""; j++ {
			if id := fmt.Sprintf("twice-%d-%d", i, j); r.owner(ks.SessionKey(id)) == r.victim {
				cand = id
			}
		}
		startPinger(t, r.gw, cand, 0)
		waitFor(t, waitLong, cand+"'s session", func() bool { return h.inIndex(cand) })
		v, err := h.rdb.ZScore(ctx, ks.IndexKey(session.Bucket(cand)), cand).Result()
		if err != nil {
			t.Fatal(err)
		}
		d := time.UnixMilli(int64(v))
		if f := frac(d); f >= phase+50*time.Millisecond && f <= want+150*time.Millisecond {
			uid, deadline = cand, d
		}
	}
	waitFor(t, waitLong, "the guide of "+uid+"'s silence", func() bool { return len(byUID(h.events())[uid]) > 0 })
	guided := r.now()
	second := deadline.Truncate(time.Second).Add(time.Second)
	if guided.After(second.Add(-150 * time.Millisecond)) {
		t.Skipf("guided at %s, too late in the deadline's second (%s) to restart in it: this machine is too slow to show the case", guided.Format("15:04:05.000"), deadline.Format("15:04:05.000"))
	}
	if err := h.cluster.Masters[r.victim].RestartEmpty(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := r.now()
	t.Logf("look phase %v; deadline %s, guided %s, restarted by %s (run %s)", phase, deadline.Format("15:04:05.000"),
		guided.Format("15:04:05.000"), restarted.Format("15:04:05.000"), r.run(r.victim))
	r.serving()
	b := r.resynced()
	stop()
	if n := len(byUID(h.events())[uid]); n != 1 {
		t.Errorf("%s's silence (deadline %s) was guided at %s, before its master restarted empty (by %s): %d guides, want 1; the gateway took the restart for %s (its uptime back from the read) and handed the grant over as lapsed",
			uid, deadline.Format("15:04:05.000"), guided.Format("15:04:05.000"), restarted.Format("15:04:05.000"), n, b.Start.Format("15:04:05.000"))
	}
}
