package gateway

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// The attack tests of the heartbeat's own connection. The heartbeat tells
// the listener whether this instance can renew its users; once it has a
// connection of its own, that connection can live while the ones that
// renew cannot. Here Redis is at its maxclients and the gateway's other
// connections are gone (killed, timed out, dropped by the network): the
// shared pool cannot open a new one, and the heartbeat's, open all along,
// still answers.

// beatConnIDs are the Redis client ids of the heartbeat's own
// connections, which the fault spares.
func beatConnIDs(t *testing.T, tg *testGateway) []int64 {
	t.Helper()
	id, err := tg.ctlRdb.(*redis.Client).ClientID(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return []int64{id}
}

// cutAllButBeat fills Redis up to its maxclients and kills every client
// connection but admin's and the heartbeat's. Cleanup lifts the limit,
// before the gateway stops (cleanups run last first).
func cutAllButBeat(t *testing.T, admin *redis.Conn, tg *testGateway) {
	t.Helper()
	ctx := context.Background()
	spare := map[int64]bool{}
	for _, id := range beatConnIDs(t, tg) {
		spare[id] = true
	}
	self, err := admin.ClientID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	spare[self] = true
	if err := admin.ConfigSet(ctx, "maxclients", "1").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.ConfigSet(context.Background(), "maxclients", "10000") })
	list, err := admin.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id, _ := strconv.ParseInt(v, 10, 64)
				if !spare[id] {
					admin.ClientKillByFilter(ctx, "ID", v)
					killed++
				}
			}
		}
	}
	if killed == 0 {
		t.Fatal("no connection of the gateway to cut")
	}
}

// guardState is what the listener reads of one instance and one deadline
// (pkg/expiry outageHold): whether it would hold a timeout due at d.
type guardState struct {
	now, last time.Time
	lease     time.Duration
	blind     []session.BlindInterval
}

func readGuard(t *testing.T, admin redis.Cmdable, ks session.Keyspace, instance string) guardState {
	t.Helper()
	now, err := admin.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	g := guardState{now: now}
	var ok bool
	if g.last, g.lease, ok = readBeat(t, admin, ks, instance); !ok {
		t.Fatalf("no heartbeat of %s", instance)
	}
	g.blind = readBlind(t, admin, ks, instance)
	return g
}

// readBeat is instance's last heartbeat and lease, read straight from
// Redis; ok is false before its first.
func readBeat(t *testing.T, admin redis.Cmdable, ks session.Keyspace, instance string) (last time.Time, lease time.Duration, ok bool) {
	t.Helper()
	v, err := admin.HGet(context.Background(), ks.AliveKey(), instance).Result()
	if err == redis.Nil {
		return time.Time{}, 0, false
	}
	if err != nil {
		t.Fatalf("heartbeat of %s: %v", instance, err)
	}
	l, p, _ := strings.Cut(v, ":")
	lms, _ := strconv.ParseInt(l, 10, 64)
	pms, _ := strconv.ParseInt(p, 10, 64)
	return time.UnixMilli(lms), time.Duration(pms) * time.Millisecond, true
}

// readBlind is the blind intervals that hold instance's users: its own
// and everyone's.
func readBlind(t *testing.T, admin redis.Cmdable, ks session.Keyspace, instance string) []session.BlindInterval {
	t.Helper()
	members, err := admin.ZRange(context.Background(), ks.BlindKey(), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []session.BlindInterval
	for _, m := range members {
		if b, err := session.ParseBlindInterval(m); err == nil && (b.Scope == "" || b.Scope == instance) {
			out = append(out, b)
		}
	}
	return out
}

// holds reports whether the listener would hold a timeout of this
// instance's user due at d, and why.
func (g guardState) holds(d time.Time) (bool, string) {
	missed := g.lease == 0 || g.now.After(g.last.Add(g.lease)) || g.now.After(g.last.Add(g.lease/3+session.BeatSlack))
	if missed && !d.Before(g.last.Add(-g.lease)) {
		return true, "missed heartbeat"
	}
	for _, b := range g.blind {
		if !d.Before(b.Start) {
			return true, "blind interval " + b.Reason
		}
	}
	return false, ""
}

// TestAttackBeatAliveWhileRenewalsCannotConnect: the gateway's renewal
// connections are gone and Redis refuses new ones; the heartbeat's own
// connection lives. alice keeps pinging (every ping fails), so she is
// there. Her deadline must be held by the listener: either the instance
// misses heartbeats, or the renewal outage is recorded as a blind interval
// of the instance before her deadline is swept. Otherwise the listener
// guides a user who is still there.
func TestAttackBeatAliveWhileRenewalsCannotConnect(t *testing.T) {
	srv := redistest.Start(t)
	tg := startGatewayOn(t, []string{srv.Addr}, redistest.Prefix(t), func(c *Config) {
		c.SessionTTL = 3 * time.Second
		c.SessionJitter = 0
	})
	ctx := context.Background()
	admin := redistest.Client(t, srv).Conn()
	t.Cleanup(func() { admin.Close() })
	ks := tg.store.Keyspace()

	ws := tg.dial(t, "alice")
	pingPong(t, ws)
	ms, err := admin.ZScore(ctx, ks.IndexKey(session.Bucket("alice")), "alice").Result()
	if err != nil {
		t.Fatal(err)
	}
	cutAllButBeat(t, admin, tg)
	deadline := time.UnixMilli(int64(ms))

	// alice pings every 300ms until the end, as a client that is there.
	var pongs, errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			if bytes.Contains(b, []byte(`"type":"pong"`)) {
				pongs.Add(1)
			} else {
				errs.Add(1)
			}
		}
	})
	wg.Go(func() {
		tk := time.NewTicker(300 * time.Millisecond)
		defer tk.Stop()
		for {
			ws.SetWriteDeadline(time.Now().Add(time.Second))
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	})
	defer func() { close(stop); ws.Close(); wg.Wait() }()

	// The listener sweeps every 200ms by default: a deadline unheld for
	// longer than that after it passed is guided.
	// Watched until Redis's clock is 2s past the deadline, or the deadline
	// stayed unheld for over a second.
	var unheldSince time.Time
	var last guardState
	waitUntil(t, "Redis's clock 2s past alice's deadline", func() bool {
		g := readGuard(t, admin, ks, tg.instance)
		last = g
		if g.now.After(deadline.Add(2 * time.Second)) {
			return true
		}
		if held, _ := g.holds(deadline); !held && !g.now.Before(deadline) {
			if unheldSince.IsZero() {
				unheldSince = g.now
			}
		} else {
			unheldSince = time.Time{}
		}
		return !unheldSince.IsZero() && g.now.Sub(unheldSince) > time.Second
	})
	if pongs.Load() != 0 {
		t.Fatalf("%d pings renewed: the fault did not cut the renewals", pongs.Load())
	}
	if errs.Load() == 0 {
		t.Fatal("no ping was answered with an error")
	}
	if !unheldSince.IsZero() {
		t.Errorf("alice pinged every 300ms, and every ping failed (%d errors), yet her deadline %v was not held "+
			"from %v (%v after it) for over a second: instance %s heartbeat %v ago (lease %v), "+
			"blind intervals of it %v; the listener guides a user who is still there",
			errs.Load(), deadline.Format(time.StampMilli), unheldSince.Format(time.StampMilli), unheldSince.Sub(deadline),
			tg.instance, last.now.Sub(last.last), last.lease, last.blind)
	}
}

// TestAttackBeatNoShedWhileRenewalsCannotConnect: the same fault, with a
// client that pings every 11s (within a 20s TTL). The gateway cannot
// renew anyone for longer than ShedAfter: it must shed its clients, so
// that they reconnect to an instance that can renew them. A heartbeat that
// gets through must not count as proof that renewals would.
func TestAttackBeatNoShedWhileRenewalsCannotConnect(t *testing.T) {
	if testing.Short() {
		t.Skip("some 15s of an outage")
	}
	srv := redistest.Start(t)
	const shedAfter = 12 * time.Second
	tg := startGatewayOn(t, []string{srv.Addr}, redistest.Prefix(t), func(c *Config) {
		c.SessionTTL = 20 * time.Second
		c.SessionJitter = 0
		c.ShedAfter = shedAfter
	})
	admin := redistest.Client(t, srv).Conn()
	t.Cleanup(func() { admin.Close() })

	ws := tg.dial(t, "bob")
	pingPong(t, ws)
	cutAllButBeat(t, admin, tg)
	cut := time.Now()

	pingFails(t, ws)
	closed := make(chan int, 1)
	go func() {
		// What bob reads after his pings: the error of his next one, or
		// the close of a shed.
		for {
			ws.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, _, err := ws.ReadMessage()
			if err != nil {
				code := -1
				if ce, ok := err.(*websocket.CloseError); ok {
					code = ce.Code
				}
				closed <- code
				return
			}
		}
	}()
	nextPing := cut.Add(11 * time.Second)
	for time.Since(cut) < shedAfter+2*time.Second {
		select {
		case code := <-closed:
			if code != websocket.CloseTryAgainLater {
				t.Fatalf("connection ended with %d, want a shed's %d", code, websocket.CloseTryAgainLater)
			}
			return // shed: as it should be
		case <-time.After(200 * time.Millisecond):
		}
		if !nextPing.IsZero() && time.Now().After(nextPing) {
			ws.SetWriteDeadline(time.Now().Add(time.Second))
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
			nextPing = time.Time{}
		}
	}
	t.Errorf("Redis refused every renewal for %v (ShedAfter %v), and the gateway did not shed its client: "+
		"it counts Redis out of reach only since %v, %v after the cut",
		time.Since(cut).Round(100*time.Millisecond), shedAfter, tg.reach.cutOffSince().Format(time.StampMilli),
		tg.reach.cutOffSince().Sub(cut).Round(100*time.Millisecond))
}
