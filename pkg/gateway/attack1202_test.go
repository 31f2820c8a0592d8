package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
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

// Attacks on the judgement of an inbox copy of a close stage handed by a
// connection's own take (its connect's, or its hold's end's): there when
// the close was applied at or after the connection opened, by kept_ms
// when when it was applied cannot be read.

// a1202Cross orders a push of a close stage against a device's connect
// on the gateway's Redis client: once armed, the first keep of uid's
// inbox (the push's keep ahead) runs, then kept is closed and the push
// waits until handed reports the device handed the entry. While failGet
// is set, the first read of when a close of uid was applied
// (Store.CloseAppliedAt's GET of its "pca:" key) fails, as a connection
// reset would.
type a1202Cross struct {
	names     map[string]string
	uid       string
	inboxKey  string
	armed     atomic.Bool
	fired     atomic.Bool
	kept      chan struct{}
	handed    func() bool
	failGet   atomic.Bool
	getFailed atomic.Int32
}

func (h *a1202Cross) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *a1202Cross) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *a1202Cross) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "get" && h.failGet.Load() && h.getFailed.Load() == 0 {
			if k, ok := cmd.Args()[1].(string); ok && acNamesCloseAt(k, h.uid) {
				h.getFailed.Add(1)
				err := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
				cmd.SetErr(err)
				return err
			}
		}
		err := next(ctx, cmd)
		if err == nil && h.armed.Load() && acScriptOf(h.names, cmd) == "inbox_keep" && acNames(cmd, h.inboxKey) && h.fired.CompareAndSwap(false, true) {
			close(h.kept)
			waitFor(patience, h.handed)
		}
		return err
	}
}

// acNamesCloseAt reports whether key is a CloseAtKey of uid.
func acNamesCloseAt(key, uid string) bool { return strings.Contains(key, "pca:"+uid+"/") }

// a1202KeptMS is the kept_ms of uid's inbox entry of guide id, or 0.
func (tg *testGateway) a1202KeptMS(t *testing.T, uid, id string) int64 {
	t.Helper()
	raw, err := tg.rdb.LRange(context.Background(), tg.store.Keyspace().InboxKey(uid), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range raw {
		var e struct {
			ID     string `json:"id"`
			KeptMS int64  `json:"kept_ms"`
		}
		if json.Unmarshal([]byte(r), &e) == nil && e.ID == id {
			return e.KeptMS
		}
	}
	return 0
}

// TestAttack1202CrossingConnectAfterKeepFallback: device A is connected
// and silent; close stage c is pushed. The push keeps c ahead of its live
// copy; device D of the same user connects just then (its upgrade a
// couple of milliseconds after the keep, before the push reads the hub):
// D's connect's take hands it c's entry, deciding the close applied
// after D opened, and the push's delivery then reaches D with the live
// copy. D was open, its user silent, when the close was applied, exactly
// the crossing TestAheadCloseHandedFirstStillCloses has, and must be
// closed 4000 after the inbox copy (docs/protocol.md, "Inbox": "handing
// it over on a connect that crossed the push ... the live copy then
// closes it (4000)"), as it is when Redis answers.
//
// When the one read of when the close was applied fails (a connection
// reset, a failover: the take's other calls went through), there() falls
// back to the entry's kept_ms, which was before D opened: D counts as the
// user come back, the inbox copy closes nothing and the live copy is
// dropped on D as a copy. D is shown the close and left open, its user's
// session not ended: the defect the change fixed, back on one failed GET.
// The same failure with the live copy first closes D (closeDecision
// without a time closes), so the outcome depends again on which copy
// comes first.
// Since a close's decision brings when it was applied, in one call
// (close_commit.lua), no separate read of that time is left on this
// path; the test keeps the interleaving and its armed hook, so that a
// separate read brought back, and failing, is caught.
func TestAttack1202CrossingConnectAfterKeepFallback(t *testing.T) {
	for _, tc := range []struct {
		name    string
		failGet bool
	}{
		{"Redis answers", false},
		{"the applied time's read fails", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := "a1202-cross-fallback"
			h := &a1202Cross{names: session.ScriptNames(), uid: uid, kept: make(chan struct{})}
			tg := startGatewayHooked(t, []string{redistest.Start(t).Addr}, redistest.Prefix(t), slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
				c.WriteTimeout = 30 * time.Second
				c.routeRefreshEvery = time.Hour // only the connect hands D the inbox
			}, func(g *Gateway) { g.rdb.AddHook(h) })
			h.inboxKey = tg.store.Keyspace().InboxKey(uid)

			wsA := tg.dial(t, uid)
			aofServed(t, wsA)
			cA := tg.hub.lookup(uid)[0]
			c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
			var cD atomic.Pointer[conn]
			h.handed = func() bool { d := cD.Load(); return d != nil && d.sentGuide(c.ID) }
			h.armed.Store(true)

			type result struct {
				res push.Response
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := tg.pushGuide(t, c)
				done <- result{res, err}
			}()
			select {
			case <-h.kept:
			case <-time.After(patience):
				t.Fatal("the push kept nothing ahead: the race was not run")
			}
			kept := tg.a1202KeptMS(t, uid, c.ID)
			if kept == 0 {
				t.Fatal("c's entry kept ahead not found")
			}
			// D opens after the keep, by the gateway's own clock of Redis.
			waitUntil(t, "the gateway's clock past the keep", func() bool { return tg.redisNowMS() > kept+1 })
			h.failGet.Store(tc.failGet)
			wsD := tg.dial(t, uid)
			for _, cn := range tg.hub.lookup(uid) {
				if cn != cA {
					cD.Store(cn)
				}
			}
			if cD.Load().openedMS <= kept {
				t.Fatalf("D opened at %d, not after c was kept at %d: the test's premise fails", cD.Load().openedMS, kept)
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(2 * patience):
				t.Fatal("the push did not end")
			}
			if r.err != nil || r.res.Status != push.Delivered || r.res.Connections != 2 {
				t.Fatalf("push c: %+v, %v; want delivered to A and D", r.res, r.err)
			}
			if tc.failGet && h.getFailed.Load() == 0 {
				// The decision brings the time in one call (close_commit.lua):
				// no separate read is left to fail on this path. The hook
				// stays armed, so that one brought back fails the test below.
				t.Log("no separate read of c's applied time: it came with the close's decision")
			}
			at, _ := tg.store.CloseAppliedAt(context.Background(), uid, c.ID)
			readStage(t, wsA, c)
			readClose(t, wsA)
			readStage(t, wsD, c)
			if !waitFor(patience, cD.Load().inactive) {
				t.Errorf("D (opened at %d, c kept at %d, its close applied at %d, while D was open and silent) was shown c and is left open, "+
					"its user's session alive: its connect's inbox copy, judged by kept_ms when the applied time's read failed, "+
					"counted D as the user come back, and the push's live copy was dropped on D as a copy",
					cD.Load().openedMS, kept, at)
			}
		})
	}
}

// TestAttack1202HeldComeBackClosedByRoutedRetry: the user has device S2
// on instance P and device D on instance X, both silent. Close stage c
// is pushed on P: P decides its close (applied), S2 is written c, closed
// 4000, and proves it, which takes c's entry kept ahead out of the
// inbox. P routes c to X, whose decision fails (Redis, for a moment): D
// refuses c, and routedIn delivers it again later (redeliverUndecided).
// Meanwhile the user comes back on X, after the chat was closed, with a
// client that asks for its guides after its first ping (first=ping):
// device H, which holds its guides. Redis comes back, and X's retry
// reaches D, silent when the chat closed (told and closed, as owed), and
// H, which holds it unsent, deciding nothing. H's first frame, a ping,
// ends its hold: the held copy is taken as a connection deciding alone
// (takeGuide with no delivery's decision), which never asks when the
// close was applied, so H, opened after the chat closed and pinging, is
// written c and closed 4000, and the session the user started on it
// ended. TestAttack1201eRoutedRetryClosesUserComeBack has the same with a
// client that does not hold its guides, and there the user stays.
func TestAttack1202HeldComeBackClosedByRoutedRetry(t *testing.T) {
	uid := "a1202-held-come-back"
	x, _, wsD, cD, fail, c, at := a1202RetryPending(t, uid)

	// The user comes back on X, after the chat was closed, with a client
	// that pings first; X's retry of c still waits for Redis.
	wsH := x.dialFirstPing(t, uid)
	cH := a1202CameBack(t, x, uid, cD, at)
	fail.on.Store(false) // X's next retry of c decides

	// D, there and silent when the chat closed, is owed c and the close.
	readStage(t, wsD, c)
	readClose(t, wsD)
	waitUntil(t, "X's retry of c held by H", func() bool { return cH.holdsGuide(c.ID) })
	// H's first frame, a ping: the user is back, on a connection opened
	// after the chat closed. It must be left open, its session alive.
	a1201eStillOpen(t, wsH, c.ID, "H, the user's connection on X made after the chat closed (first=ping), and pinged on")
}

// a1202RetryPending is the start of the come-back attacks: device D on
// instance X (its Redis client hooked by fail and hooks; its connections
// may hold their guides until their first ping), device S2 on instance
// P, both silent. Close stage c is pushed on P while X's decisions fail:
// S2 is told and closed, and proves it, so c's entry kept ahead leaves
// the inbox; X's routed copy waits in its retries (redeliverUndecided).
// at is when c's close was applied, and X's clock of Redis is past it.
func a1202RetryPending(t *testing.T, uid string, hooks ...redis.Hook) (x, p *testGateway, wsD *websocket.Conn, cD *conn, fail *a1201dFailDecide, c push.Request, at int64) {
	t.Helper()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	fail = &a1201dFailDecide{uid: uid}
	x = startGatewayHooked(t, []string{srv.Addr}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
		c.firstPingWaitFor = time.Minute
	}, func(g *Gateway) {
		g.rdb.AddHook(fail)
		for _, h := range hooks {
			g.rdb.AddHook(h)
		}
	})
	p = startGatewayOn(t, []string{srv.Addr}, prefix, func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	})

	wsD = x.dial(t, uid)
	aofServed(t, wsD)
	cD = x.hub.lookup(uid)[0]
	ws2 := p.dial(t, uid)
	aofServed(t, ws2)
	c = stagePush(uid, redisNowMS(t, p.rdb), 2, timeoutevent.ActionClose)
	fail.on.Store(true)
	if res, err := p.pushGuide(t, c); err != nil || res.Status != push.Delivered || res.Connections != 2 {
		fail.on.Store(false)
		t.Fatalf("push c on P: %+v, %v; want delivered to S2 here and X's subscriber", res, err)
	}
	// S2, there and silent, is told and closed: the chat is closed.
	readStage(t, ws2, c)
	readClose(t, ws2)
	waitUntil(t, "X's decision of c failed", func() bool { return fail.fails.Load() >= 1 })
	waitUntil(t, "c's entry kept ahead out of the inbox by S2's proof", func() bool { return len(p.aaInboxIDs(t, uid)) == 0 })
	at, err := p.store.CloseAppliedAt(context.Background(), uid, c.ID)
	if err != nil || at == 0 {
		t.Fatalf("c's close applied at %d, %v; want it applied on S2, its time kept", at, err)
	}
	waitUntil(t, "X's clock of Redis past the close", func() bool { return x.redisNowMS() > at+1 })
	return x, p, wsD, cD, fail, c, at
}

// a1202CameBack is the user's connection on x other than cD, just dialed,
// which must have opened after the close applied at at.
func a1202CameBack(t *testing.T, x *testGateway, uid string, cD *conn, at int64) *conn {
	t.Helper()
	var cB *conn
	for _, cn := range x.hub.lookup(uid) {
		if cn != cD {
			cB = cn
		}
	}
	if cB == nil || cB.openedMS <= at {
		t.Fatalf("the user's new connection %v did not open after c's close was applied at %d: the test's premise fails", cB, at)
	}
	return cB
}
