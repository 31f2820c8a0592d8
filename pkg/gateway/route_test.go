package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// TestJudgeDead: an instance is dead once its lease has run out by the
// estimate of Redis's clock; the cut of its route entries is the read, if
// it was dead then, or else its lease's end, so that what it writes after
// it comes back (a heartbeat after the cut) is never taken for its old
// life's.
func TestJudgeDead(t *testing.T) {
	t0 := time.UnixMilli(1_000_000)
	inst := session.Instance{Last: t0, Lease: 600 * time.Millisecond}
	for _, tc := range []struct {
		name      string
		inst      session.Instance
		read, now time.Duration // after t0
		dead      bool
		cut       time.Duration // after t0
	}{
		{"alive at the read and now", inst, 100 * time.Millisecond, 500 * time.Millisecond, false, 0},
		{"lease ends exactly now", inst, 100 * time.Millisecond, 600 * time.Millisecond, false, 0},
		{"alive at the read, dead by the estimate", inst, 100 * time.Millisecond, 900 * time.Millisecond, true, 600 * time.Millisecond},
		{"dead at the read", inst, 2 * time.Second, 2100 * time.Millisecond, true, 2*time.Second - time.Millisecond},
		{"left: dead from its last heartbeat", session.Instance{Last: t0}, 0, time.Millisecond, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cut, dead := judgeDead(tc.inst, t0.Add(tc.read), t0.Add(tc.now))
			if dead != tc.dead {
				t.Fatalf("dead = %v, want %v", dead, tc.dead)
			}
			if dead && !cut.Equal(t0.Add(tc.cut)) {
				t.Errorf("cut = t0%+v, want t0%+v", cut.Sub(t0), tc.cut)
			}
		})
	}
}

// TestStaleViewKeepsReturnedInstance: an instance that other instances
// have seen dead comes back (its heartbeat finds the gap) and registers
// its users again. A route write of an instance whose view still shows it
// dead drops the entries it wrote before, never the ones it wrote since:
// the view of heartbeats is read every heartbeat, so such writes follow
// a return for up to an interval.
func TestStaleViewKeepsReturnedInstance(t *testing.T) {
	ctx := context.Background()
	tg := startGateway(t, func(c *Config) { c.HeartbeatInterval = 10 * time.Second }) // the view is read only when the test says
	store := tg.store
	ks := store.Keyspace()
	key := ks.RouteKey("ivy")
	register := func() {
		t.Helper()
		if res := store.WriteRoutes(ctx, "gw-back", []session.RouteCount{{UID: "ivy", Count: 1}}, time.Minute, nil); res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
	}
	if _, err := store.Heartbeat(ctx, "gw-back", 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	register()
	// gw-back stalls past its lease, and tg's view sees it dead.
	waitUntil(t, "gw-back's lease runs out in tg's view", func() bool {
		tg.readInstances(ctx)
		return tg.instanceDead("gw-back")
	})
	// gw-back comes back: its heartbeat finds the gap, and it registers
	// ivy again, before tg reads the heartbeats again.
	b, err := store.Heartbeat(ctx, "gw-back", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Gap {
		t.Fatal("the heartbeat after the lease ran out found no gap")
	}
	register()
	if err := tg.routes.write(ctx, "ivy", closeNone); err != nil {
		t.Fatal(err)
	}
	if n, _ := tg.rdb.HGet(ctx, key, "gw-back").Int(); n != 1 {
		t.Fatal("a route write with a view older than gw-back's return dropped what gw-back wrote since")
	}
	// A push through tg finds nobody on gw-back's channel (there is no
	// process behind it): it does not drop the entry either, and asks
	// for a retry.
	if _, kept, err := store.DropDeadRoutes(ctx, "ivy", tg.recentlyDead()); err != nil || kept != 1 {
		t.Fatalf("DropDeadRoutes with the stale view: kept %d, %v; want the entry kept", kept, err)
	}

	// Without a return, the same write drops it.
	if err := store.Leave(ctx, "gw-back"); err != nil {
		t.Fatal(err)
	}
	tg.readInstances(ctx)
	if err := tg.routes.write(ctx, "ivy", closeNone); err != nil {
		t.Fatal(err)
	}
	if tg.rdb.HExists(ctx, key, "gw-back").Val() {
		t.Fatal("an instance that left stayed in the route")
	}
	if tg.rdb.HExists(ctx, ks.RouteStampKey("ivy"), "gw-back").Val() {
		t.Fatal("an instance dropped from the route kept its stamp")
	}
}

// TestEndMarkDoesNotOutliveLaterDrop: while Redis is out of reach, a
// user closes normally (1000), reconnects, and drops. The route writer
// holds the user's writes until Redis answers; the latest close decides,
// as it would had each been written when it happened: that was a drop,
// so the session stays, and the silence is guided. A normal close whose
// write failed must not stick past the reconnect.
func TestEndMarkDoesNotOutliveLaterDrop(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	proxy, err := tcpproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	var logs lockedBuffer
	tg := startGatewayLogged(t, []string{proxy.Addr()}, redistest.Prefix(t), slog.New(slog.NewTextHandler(&logs, nil)), nil)
	direct := redistest.Client(t, srv)
	ks := tg.store.Keyspace()
	exists := func() bool { return direct.Exists(ctx, ks.SessionKey("ivy")).Val() == 1 }

	first := tg.dial(t, "ivy")
	pingPong(t, first)
	if !exists() {
		t.Fatal("no session after a ping")
	}

	proxy.Cut()
	closeNormally(first)
	waitUntil(t, "the normal close counted out of the hub", func() bool { return tg.hub.count("ivy") == 0 })
	again := tg.dial(t, "ivy") // its route write fails too
	waitUntil(t, "the reconnect in the hub", func() bool { return tg.hub.count("ivy") == 1 })
	again.NetConn().Close() // a drop: no close frame
	waitUntil(t, "the drop counted out of the hub", func() bool { return tg.hub.count("ivy") == 0 })
	proxy.Restore()

	// A write of ivy's route returns once the writer has written ivy's
	// mark, the held ones with it.
	waitUntil(t, "ivy's route written", func() bool {
		wctx, cancel := context.WithTimeout(ctx, routeWriteTimeout)
		defer cancel()
		return tg.routes.write(wctx, "ivy", closeNone) == nil
	})
	if direct.HExists(ctx, ks.RouteKey("ivy"), tg.instance).Val() {
		t.Fatal("the route still counts a connection of ivy here")
	}
	if !exists() {
		t.Fatal("ivy's session was ended: a normal close whose write failed stuck past a later reconnect that dropped")
	}
}

// The refresh writes every user's route again each period, a hub shard at
// a time: a route key lost (evicted, say) comes back within a period, and
// the users of different shards come back at different times, not in one
// burst ahead of every connect's write.
func TestRouteRefreshSpreadsOverThePeriod(t *testing.T) {
	const period = 3200 * time.Millisecond // 50ms a shard
	g := startGateway(t, func(c *Config) { c.routeRefreshEvery = period })
	ctx := context.Background()
	ks := g.store.Keyspace()
	var uids []string
	for i := range 32 {
		uid := fmt.Sprintf("spread-%02d", i)
		ws := g.dial(t, uid)
		pingPong(t, ws)
		uids = append(uids, uid)
	}
	waitUntil(t, "every user's route written", func() bool {
		for _, uid := range uids {
			if g.rdb.Exists(ctx, ks.RouteKey(uid)).Val() == 0 {
				return false
			}
		}
		return true
	})
	for _, uid := range uids {
		g.rdb.Del(ctx, ks.RouteKey(uid))
	}
	lost := time.Now()
	back := map[string]time.Time{}
	waitUntil(t, "every lost route written again by the refresh", func() bool {
		for _, uid := range uids {
			if _, ok := back[uid]; !ok && g.rdb.Exists(ctx, ks.RouteKey(uid)).Val() == 1 {
				back[uid] = time.Now()
			}
		}
		return len(back) == len(uids)
	})
	first, last := lost.Add(time.Hour), lost
	for _, at := range back {
		if at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	if took := last.Sub(lost); took > 2*period {
		t.Errorf("the last route came back %v after the loss, want within about a period (%v)", took, period)
	}
	if spread := last.Sub(first); spread < period/4 {
		t.Errorf("the routes came back within %v of each other, want them spread over the period (%v)", spread, period)
	}
}

func TestShardsDue(t *testing.T) {
	const period = 64 * time.Second // a second a shard
	for _, tt := range []struct {
		elapsed time.Duration
		want    int
	}{
		{0, 1},
		{999 * time.Millisecond, 1},
		{time.Second, 2},
		{10500 * time.Millisecond, 11},
		{63 * time.Second, hubShards},
		{period, hubShards},
		{10 * period, hubShards},
	} {
		if got := shardsDue(tt.elapsed, period); got != tt.want {
			t.Errorf("shardsDue(%v) = %d, want %d", tt.elapsed, got, tt.want)
		}
	}
	if got := shardsDue(time.Second, 0); got != hubShards {
		t.Errorf("no period: %d due, want every shard", got)
	}
	start := time.Unix(1000, 0)
	if got := nextCycle(start, start.Add(30*time.Second), period); !got.Equal(start.Add(period)) {
		t.Errorf("next cycle %v, want a period after the last", got)
	}
	if now := start.Add(2 * period); !nextCycle(start, now, period).Equal(now) {
		t.Errorf("a writer held past a period starts afresh now")
	}
}
