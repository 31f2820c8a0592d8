package gateway

import (
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on a close stage's push that fails, whoever else took it, when
// its close could not be decided on the instance it was pushed to (route's
// undecided), and on the consumer's push of it again.

// TestAttack1201eRetryClosesUserComeBack: the user has device S1 on
// instance X and device S2 on instance P, both silent. Close stage c is
// pushed on P; P's decision of its close fails (Redis, one call): S2
// refuses c. P routes c to X, where S1 is written c, the close is
// applied, S1 is closed 4000 and proves c, which takes c's entry kept
// ahead out of the inbox. The push fails all the same (undecided), for
// the consumer to push c again. Meanwhile the user comes back: told on
// S1 that the chat closed, they connect again (the load balancer sends
// them to P) and ping, which starts a new session (docs/protocol.md,
// 4000). Their connect is handed nothing: the entry left the inbox with
// S1's proof. The consumer's push of c again, a second later, finds the
// close applied, so its claim goes through whatever the user renewed
// since, and P's delivery decides it applied for every connection there:
// the new connection B, opened after the chat was closed and the user's
// ping on it, is written c live and closed 4000, as if it had been there,
// silent, when the chat closed. The user who came back is closed as
// inactive, and their new session ended with S2's close. Only the device
// that refused c (S2) is owed it.
func TestAttack1201eRetryClosesUserComeBack(t *testing.T) {
	uid := "a1201e-retry-come-back"
	fail := &a1201dFailDecide{uid: uid, nth: 1}
	p, x := a1201dTwoInstances(t, fail)

	ws1 := x.dial(t, uid)
	aofServed(t, ws1)
	ws2 := p.dial(t, uid)
	aofServed(t, ws2)
	c := stagePush(uid, redisNowMS(t, p.rdb), 2, timeoutevent.ActionClose)
	res, err := p.pushGuide(t, c)
	if fail.fails.Load() != 1 {
		t.Fatalf("P's decision of c did not fail (push: %+v, %v): the test's premise fails", res, err)
	}
	if err == nil {
		t.Fatalf("push c: %+v; want it failed, for the consumer to push it again (undecided on P)", res)
	}
	// S1, there and silent, is told and closed: the chat is closed.
	readStage(t, ws1, c)
	readClose(t, ws1)
	waitUntil(t, "c's entry kept ahead out of the inbox by S1's proof", func() bool { return len(p.aaInboxIDs(t, uid)) == 0 })

	// The user comes back, after the chat was closed: a new connection,
	// and a ping.
	wsB := p.dial(t, uid)
	aofServed(t, wsB)
	pingPong(t, wsB)

	// The consumer pushes c again, as told.
	res, err = p.pushGuide(t, c)
	if err != nil {
		t.Fatalf("push c again: %v", err)
	}
	t.Logf("push c again: %+v", res)
	// S2, there and silent when the chat closed, is owed c and the close.
	readStage(t, ws2, c)
	readClose(t, ws2)
	// B is the user come back: left open, its session alive.
	a1201eStillOpen(t, wsB, c.ID, "B, the user's connection made after the chat closed, and pinged on")
}

// TestAttack1201eRoutedRetryClosesUserComeBack: the user has device S2
// on instance P and device D on instance X, both silent. Close stage c
// is pushed on P: P decides its close (applied), S2 is written c, closed
// 4000, and proves it, which takes c's entry kept ahead out of the
// inbox. P routes c to X, whose decision fails (Redis, for a moment):
// D refuses c, and routedIn delivers it again later, off the channel's
// reader (redeliverUndecided). Meanwhile the user comes back: they
// connect again, on X, after the chat was closed, and ping, which starts
// a new session. Their connect is handed nothing (the entry left the
// inbox with S2's proof). Redis comes back, and the retry's delivery
// decides c applied for every connection of the user on X: D, silent
// when the chat closed, is told and closed, as owed; but so is the new
// connection B, written c live and closed 4000. The user who came back
// is closed as inactive. The retry is owed to the devices that refused c,
// not to one that connected since.
func TestAttack1201eRoutedRetryClosesUserComeBack(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	uid := "a1201e-routed-retry-come-back"
	fail := &a1201dFailDecide{uid: uid}
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
	ws2 := p.dial(t, uid)
	aofServed(t, ws2)
	c := stagePush(uid, redisNowMS(t, p.rdb), 2, timeoutevent.ActionClose)
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

	// The user comes back on X, after the chat was closed: a new
	// connection, and a ping; X's retry of c still waits for Redis.
	wsB := x.dial(t, uid)
	aofServed(t, wsB)
	pingPong(t, wsB)
	routedIn := func() float64 { return testutil.ToFloat64(metricPushes.WithLabelValues("routed_in")) }
	before := routedIn()
	fail.on.Store(false)

	// D, there and silent when the chat closed, is owed c and the close.
	readStage(t, wsD, c)
	readClose(t, wsD)
	waitUntil(t, "X's retry of c delivered", func() bool { return routedIn() > before })
	// B is the user come back: left open, its session alive.
	a1201eStillOpen(t, wsB, c.ID, "B, the user's connection on X made after the chat closed, and pinged on")
}

// a1201eStillOpen pings on ws and wants the pong, and nothing before it:
// the connection was neither written guide id nor closed. On failure it
// says what ws saw ("guide" for id's frame, "close:<code>").
func a1201eStillOpen(t *testing.T, ws *websocket.Conn, id, what string) {
	t.Helper()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
		t.Fatalf("%s: write a ping: %v", what, err)
	}
	ws.SetReadDeadline(time.Now().Add(patience))
	defer ws.SetReadDeadline(time.Time{})
	var seen []string
	for {
		_, b, err := ws.ReadMessage()
		var ce *websocket.CloseError
		switch {
		case errors.As(err, &ce):
			t.Fatalf("%s saw %s; want it left open, and no close stage's frame", what, strings.Join(append(seen, "close:"+strconv.Itoa(ce.Code)), ","))
		case err != nil:
			t.Fatalf("%s saw %v, then read: %v; want a pong", what, seen, err)
		case strings.Contains(string(b), `"pong"`):
			if len(seen) > 0 {
				t.Fatalf("%s saw %s before its pong; want nothing", what, strings.Join(seen, ","))
			}
			return
		case strings.Contains(string(b), id):
			seen = append(seen, "guide")
		default:
			seen = append(seen, string(b))
		}
	}
}
