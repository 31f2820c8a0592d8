package gateway

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// A device that connects while a close stage is pushed may be handed the
// entry kept ahead of the live copy (ahead.go) before that copy reaches
// it: by its connect's own take, when its route write comes after the
// keep, or by an offer of the inbox (a heartbeat gap's re-registration of
// every user, a route refresh). It was open, its user silent, when the
// close was applied: the live copy must close it (4000) after the inbox
// copy, as it closes a device it reaches first.

// acScriptOf names the session script cmd runs, or "".
func acScriptOf(names map[string]string, cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 2 {
		return ""
	}
	s, _ := args[1].(string)
	switch cmd.Name() {
	case "evalsha":
		return names[s]
	case "eval":
		sum := sha1.Sum([]byte(s))
		return names[hex.EncodeToString(sum[:])]
	}
	return ""
}

// acNames reports whether cmd names key among its arguments.
func acNames(cmd redis.Cmder, key string) bool {
	return slices.ContainsFunc(cmd.Args(), func(a any) bool { s, _ := a.(string); return s == key })
}

// acRace orders a push of a close stage against a device's connect or an
// offer on the gateway's Redis client: once armed, the first keep of
// uid's inbox (the push's keep ahead) runs, then its caller waits until
// handed reports the device handed the entry; route writes of uid wait
// for that keep (gateRoutes: the device's connect writes its route after
// it, and so takes the inbox), and afterKeep runs once it is done (an
// offer).
type acRace struct {
	names              map[string]string
	routeKey, inboxKey string
	gateRoutes         bool
	armed, fired       atomic.Bool
	kept               chan struct{}
	afterKeep          func()
	handed             func() bool
}

func (h *acRace) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *acRace) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.gateRoutes && h.armed.Load() && slices.ContainsFunc(cmds, func(cmd redis.Cmder) bool {
			return acScriptOf(h.names, cmd) == "route" && acNames(cmd, h.routeKey)
		}) {
			select {
			case <-h.kept:
			case <-time.After(patience):
			}
		}
		return next(ctx, cmds)
	}
}

func (h *acRace) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && h.armed.Load() && acScriptOf(h.names, cmd) == "inbox_keep" && acNames(cmd, h.inboxKey) && h.fired.CompareAndSwap(false, true) {
			close(h.kept)
			if h.afterKeep != nil {
				go h.afterKeep()
			}
			waitFor(patience, h.handed)
		}
		return err
	}
}

// acCloseHandedFirst is the start of these tests for uid: device H holds
// its guides until its first ping, device B is live; close stage c is
// pushed, and B is handed c's entry kept ahead before its live copy
// reaches it, by its connect's take (connect) or an offer of the inbox
// after a heartbeat gap (not connect).
func acCloseHandedFirst(t *testing.T, uid string, connect bool) (tg *testGateway, wsH, wsB *websocket.Conn, cB *conn, c push.Request) {
	t.Helper()
	race := &acRace{names: session.ScriptNames(), gateRoutes: connect, kept: make(chan struct{})}
	tg = startGatewayHooked(t, []string{redistest.Start(t).Addr}, redistest.Prefix(t), slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.firstPingWaitFor = time.Minute
		c.routeRefreshEvery = time.Hour // only the race hands B the inbox
	}, func(g *Gateway) { g.rdb.AddHook(race) })
	ks := tg.store.Keyspace()
	race.routeKey, race.inboxKey = ks.RouteKey(uid), ks.InboxKey(uid)
	if !connect {
		race.afterKeep = func() { tg.routes.reregister(nil) } // as beat does after a gap
	}
	c = stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	// H holds c unsent: a connection sent it is B.
	race.handed = func() bool {
		return slices.ContainsFunc(tg.hub.lookup(uid), func(cn *conn) bool { return cn.sentGuide(c.ID) })
	}

	wsH = tg.dialFirstPing(t, uid)
	cH := tg.hub.lookup(uid)[0]
	waitUntil(t, "H's route written", func() bool {
		return tg.rdb.HGet(context.Background(), race.routeKey, tg.instance).Val() == "1"
	})
	if connect {
		race.armed.Store(true) // B's route write waits for the keep
	}
	wsB = tg.dial(t, uid)
	for _, cn := range tg.hub.lookup(uid) {
		if cn != cH {
			cB = cn
		}
	}
	if !connect {
		aofServed(t, wsB) // its connect's take is done: only the offer hands it c
		race.armed.Store(true)
	}
	if res := tg.mustPush(t, c, push.Delivered); res.Connections != 2 {
		t.Fatalf("delivered to %d connections, want 2", res.Connections)
	}
	if !race.fired.Load() {
		t.Fatal("the push kept nothing ahead: the race was not run")
	}
	return tg, wsH, wsB, cB, c
}

// TestAheadCloseHandedFirstStillCloses: B, handed c's entry kept ahead
// before the live copy, by its connect's take or by the offer a
// heartbeat gap's re-registration makes, is shown c once and closed
// 4000: it was open, its user silent, when the close was applied, and
// the push counted it among the connections that close after the frame.
// Its client gone before proving c, c is kept closed, for H. Handed by
// its connect's take (a busy host's: the route write of B's connect came
// after the push's keep ahead), the inbox copy closed nothing and the
// live copy was dropped as a copy: B was shown the close and left open,
// and c's entry stayed unclosed, for H's word to supersede.
func TestAheadCloseHandedFirstStillCloses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		connect bool
	}{
		{"connect's take", true},
		{"offer after a heartbeat gap", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := "ac-first"
			tg, _, wsB, cB, c := acCloseHandedFirst(t, uid, tc.connect)
			readStage(t, wsB, c)
			if !waitFor(patience, cB.inactive) {
				t.Errorf("B, open and silent when the close of %s was applied, and shown it, is not closed: the live copy was dropped as a copy of the inbox's", c.ID)
			}
			wsB.NetConn().Close() // B's client is gone before it proves c
			want := []string{c.ID + "(closed)"}
			if !waitFor(patience, func() bool {
				return tg.hub.count(uid) == 1 && slices.Equal(tg.aaInboxIDs(t, uid), want)
			}) {
				t.Errorf("%d connections in the hub (want 1, H), inbox %v (want %v): the close applied on B is not kept closed for H",
					tg.hub.count(uid), tg.aaInboxIDs(t, uid), want)
			}
		})
	}
}
