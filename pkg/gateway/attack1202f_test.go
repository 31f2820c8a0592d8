package gateway

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Guards of redeliverUndecided as a loop that lasts the outage, which
// pass: what it must keep doing while its known defects
// (attack1202e_test.go) are fixed.

// TestAttack1202fShutdownDuringRetriesKept (passes; kept as a guard):
// device D is connected on instance X, silent; the user has no
// connection on instance P. Close stage c is pushed on P: kept ahead,
// routed to X, answered delivered. X's decision of it fails, and X tries
// again (redeliverUndecided, on the channel's context). X shuts down
// meanwhile: the drain closes D 1001, and the loop, its context done,
// keeps c (the entry kept ahead stays). D reconnects on P and is handed
// c from the inbox: nothing was lost. It guards the shutdown ending
// (within patience) and the entry surviving the loop's end; it does not
// tell the loop's keep from the entry P kept ahead, which the keep finds
// (kept already).
func TestAttack1202fShutdownDuringRetriesKept(t *testing.T) {
	uid := "a1202f-shutdown-kept"
	fail := &a1201dFailDecide{uid: uid}
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	x := startGatewayHooked(t, []string{srv.Addr}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	}, func(g *Gateway) { g.rdb.AddHook(fail) })
	p := startGatewayOn(t, []string{srv.Addr}, prefix, func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	})

	wsD := x.dial(t, uid)
	aofServed(t, wsD)
	c := stagePush(uid, redisNowMS(t, p.rdb), 2, timeoutevent.ActionClose)
	fail.on.Store(true)
	if res, err := p.pushGuide(t, c); err != nil || res.Status != push.Delivered || res.Connections != 1 {
		t.Fatalf("push c on P: %+v, %v; want delivered to X's subscriber", res, err)
	}
	waitUntil(t, "X's decision of c failed twice (its loop under way)", func() bool { return fail.fails.Load() >= 2 })
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		x.stop(t)
	}()
	code, guided := a1202eEnd(wsD, c.ID)
	if guided || code != websocket.CloseGoingAway {
		t.Fatalf("D ended %d (guided: %v); want the drain's 1001, not c: the test's premise fails", code, guided)
	}
	select {
	case <-stopped:
	case <-time.After(patience):
		t.Fatal("X's shutdown waits on its retries of c")
	}
	fail.on.Store(false)
	a1202eToldOnReconnect(t, p, uid, c, "D (drained by X during its retries of c)")
}

// TestAttack1202fTwoDevicesOutageOneLeaves (passes; kept as a guard):
// devices D1, D2 and D3 are connected on instance X, silent. Close stage
// c is kept ahead by instance P and routed to X while X's link to Redis
// is cut, for longer than X's old six tries. D3 drops mid-retry (no
// close frame). Redis comes back, and X's route refresh offers the inbox
// (the entry kept ahead) while its retries of the live copy go on: D1 and
// D2, there and silent when the close is applied, each get c's frame
// once and the close 4000, whichever copy reaches them first; the
// inbox's entry leaves once proven.
func TestAttack1202fTwoDevicesOutageOneLeaves(t *testing.T) {
	ctx := context.Background()
	uid := "a1202f-two-devices-outage"
	cnt := &a1202Count{uid: uid, after: 1 + a1202OldTries, counts: namesCloseCommit(uid)}
	x, p, proxy := a1202Outage(t, cnt)

	var wss []*websocket.Conn
	for range 3 {
		ws := x.dial(t, uid)
		aofServed(t, ws)
		wss = append(wss, ws)
	}
	c := stagePush(uid, redisNowMS(t, p.rdb), 2, timeoutevent.ActionClose)
	p.aofKeepAhead(t, c)

	proxy.Cut()
	x.run.Tolerate()
	x.readRouted(t, c)
	waitUntil(t, "X's tries of c past the old number", func() bool { return cnt.fails.Load() >= 1+a1202OldTries })
	wss[2].NetConn().Close() // D3 drops
	waitUntil(t, "D3 gone from X", func() bool { return len(x.hub.lookup(uid)) == 2 })
	waitUntil(t, "X's tries of c go on", func() bool { return cnt.fails.Load() >= 3+a1202OldTries })
	proxy.Restore()
	waitUntil(t, "X reaches Redis again", func() bool { return x.rdb.Ping(ctx).Err() == nil })
	x.offerInbox(ctx, uid)

	got := make(chan string, 2)
	for i, ws := range wss[:2] {
		name := []string{"D1", "D2"}[i]
		go func() { got <- name + " " + a1201dFrames(ws, c.ID) }()
	}
	seen := []string{<-got, <-got}
	for _, s := range seen {
		if !strings.HasSuffix(s, " guide,close:4000") {
			t.Errorf("%s; want c's frame once, then the close 4000, on each device there (all: %v)", s, seen)
		}
	}
	waitUntil(t, "c's entry out of the inbox", func() bool { return len(p.aaInboxIDs(t, uid)) == 0 })
}

// TestAttack1202fNewConnectionDuringOutageSpared (passes; kept as a
// guard): the user has device S2 on instance P and device D on instance
// X, both silent. Close stage c is pushed on P: applied, S2 told, closed
// and proven. X's decision of the routed copy fails, and X then loses
// Redis altogether, past its old six tries. Meanwhile the user comes
// back on X: connection B, opened during the outage (after the close was
// applied), and a ping, answered "unavailable". Redis comes back: X's
// retry closes D (there and silent when the chat closed) after c's
// frame, and spares B, opened after the close by X's own clock of
// Redis, which it keeps through the outage.
func TestAttack1202fNewConnectionDuringOutageSpared(t *testing.T) {
	ctx := context.Background()
	uid := "a1202f-new-during-outage"
	fail := &a1201dFailDecide{uid: uid}
	x, p, proxy := a1202Outage(t, fail)

	wsD := x.dial(t, uid)
	aofServed(t, wsD)
	cD := x.hub.lookup(uid)[0]
	ws2 := p.dial(t, uid)
	aofServed(t, ws2)
	c := stagePush(uid, redisNowMS(t, p.rdb), 2, timeoutevent.ActionClose)
	fail.on.Store(true)
	if res, err := p.pushGuide(t, c); err != nil || res.Status != push.Delivered || res.Connections != 2 {
		t.Fatalf("push c on P: %+v, %v; want delivered to S2 here and X's subscriber", res, err)
	}
	readStage(t, ws2, c)
	readClose(t, ws2)
	waitUntil(t, "c's entry kept ahead out of the inbox by S2's proof", func() bool { return len(p.aaInboxIDs(t, uid)) == 0 })
	at, err := p.store.CloseAppliedAt(ctx, uid, c.ID)
	if err != nil || at == 0 {
		t.Fatalf("c's close applied at %d, %v; want it applied on S2", at, err)
	}

	proxy.Cut()
	x.run.Tolerate()
	waitUntil(t, "X's tries of c past the old number", func() bool { return fail.fails.Load() >= 3+a1202OldTries })
	wsB := x.dial(t, uid)
	cB := a1202CameBack(t, x, uid, cD, at)
	pingSaying(t, wsB, -1)
	a1202eUnavailable(t, wsB)
	if cD.isClosed() || cB.isClosed() {
		t.Fatal("D or B closed during the outage: the test's premise fails")
	}
	proxy.Restore()
	fail.on.Store(false)

	readStage(t, wsD, c)
	readClose(t, wsD)
	a1202eLeftAlone(t, wsB, c.ID, "B, the user's connection opened on X during the outage, after c's close was applied")
}
