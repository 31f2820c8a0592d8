package expiry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/session"
)

// masterOf is the index in h.cluster.Masters of the master serving key.
func (h *harness) masterOf(key string) int {
	h.t.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: h.cluster.Masters[0].Addr})
	defer c.Close()
	slot, err := c.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	slots, err := redisserver.SlotMap(ctx, c)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			for i, m := range h.cluster.Masters {
				if m.Addr == s.Master {
					return i
				}
			}
		}
	}
	h.t.Fatalf("no master serves %s", key)
	return -1
}

// TestAttackClusterFailoverNoBlindInterval: a Redis Cluster master that
// does not hold the control keys fails over (the issue's own fault), just
// before its users' next pings. Those pings' renewals do not fail: the
// gateway's cluster client holds them in its retries until it finds the
// promoted master, and they land, answered with a pong, after the
// deadline they were meant to extend. The listener's client learned the
// new master sooner and has already swept the lapsed deadlines. Nothing
// marks the time as blind: no renewal failed, so the gateway records no
// renewals-gap; the mark loop kept marking the {ctl} master, so there is
// no sweep gap; and a failover changes the master's address, so the
// run-id check does not see it. Users who pinged on time and got their
// pong are guided.
func TestAttackClusterFailoverNoBlindInterval(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster failover")
	}
	t.Parallel()
	h := newClusterHarness(t, true)
	ks := h.store.Keyspace()
	ctlMaster := h.masterOf(ks.AliveKey())
	victim := (ctlMaster + 1) % len(h.cluster.Masters)
	var uids []string
	for i := 0; len(uids) < 11; i++ {
		uid := fmt.Sprintf("u-%d", i)
		if h.masterOf(ks.IndexKey(session.Bucket(uid))) == victim {
			uids = append(uids, uid)
		}
	}
	const ttl = 4 * time.Second
	gw := h.startAttackGateway(h.cluster.Addrs()[0], ttl, func(c *gateway.Config) {
		c.Redis.Addrs, c.Redis.Cluster = h.cluster.Addrs(), true
	})
	cfg := h.config(ModeSweep)
	cfg.OutageGrace = 5 * time.Second // >= TTL + jitter (0) + 1s to reconnect
	stop := h.start(cfg)
	defer stop()

	period := ttl * 3 / 4
	var active []*pinger
	for _, uid := range uids[1:] {
		active = append(active, startPinger(t, gw, uid, period))
	}
	startPinger(t, gw, uids[0], 0) // silent
	started := time.Now()
	// Kill the master just before the second ping of everyone. Real time
	// must pass: the pingers' own clocks set when that is.
	time.Sleep(time.Until(started.Add(period - 200*time.Millisecond)))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if err := h.cluster.Failover(ctx, victim); err != nil {
		t.Fatal(err)
	}
	t.Logf("failover done %v after the first ping", time.Since(started))
	// When did the renewal of the ping sent just after the kill land?
	first, err := h.rdb.ZScore(ctx, ks.IndexKey(session.Bucket(uids[1])), uids[1]).Result()
	if err != nil {
		t.Fatal(err)
	}
	failedOver := h.redisNow()
	var landed time.Time
	eventually(ttl+time.Second, func() bool {
		if sc, err := h.rdb.ZScore(ctx, ks.IndexKey(session.Bucket(uids[1])), uids[1]).Result(); err == nil && sc != first {
			landed = h.redisNow()
			return true
		}
		return false
	})
	// Every deadline the failover could touch has passed, held or not.
	h.sweptPast(failedOver.Add(ttl + cfg.OutageGrace))
	for _, p := range active {
		p.stop()
	}
	stop()
	got := byUID(h.events())
	for _, p := range active {
		if evs := got[p.uid]; len(evs) > 0 {
			t.Errorf("%s pinged every %v throughout (%d pongs, %d errors), yet got %d timeout event(s), deadline %v detected %v",
				p.uid, period, p.pongs.Load(), p.errs.Load(), len(evs),
				time.UnixMilli(evs[0].DeadlineMS).Format("15:04:05.000"), time.UnixMilli(evs[0].DetectedMS).Format("15:04:05.000"))
		}
	}
	if evs := got[uids[1]]; len(evs) > 0 && !landed.IsZero() {
		t.Logf("%s: its timeout was produced at %v; the renewal of its ping, sent before that deadline, landed at %v (%v later): a consumer checking the session in between finds none",
			uids[1], time.UnixMilli(evs[0].DetectedMS).Format("15:04:05.000"), landed.Format("15:04:05.000"),
			landed.Sub(time.UnixMilli(evs[0].DetectedMS)))
	}
	if n := len(got[uids[0]]); n != 1 {
		t.Errorf("silent user: %d events, want 1", n)
	}
}
