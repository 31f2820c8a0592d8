package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on a close stage's decision made once per delivery
// (closeDecision), and on a push that fails when no connection took the
// guide for want of that decision.

// a1201dFailDecide fails uid's close decisions (close_commit.lua run to
// decide, its mode "1"), as a connection reset would, on the client it
// hooks: the nth such call when nth > 0, and every one while on is set.
// Cancellation-only looks (closeOver's, mode "0") and applies (mode "2")
// pass.
type a1201dFailDecide struct {
	uid   string
	nth   int32
	on    atomic.Bool
	calls atomic.Int32
	fails atomic.Int32
}

func (h *a1201dFailDecide) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *a1201dFailDecide) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *a1201dFailDecide) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			args := cmd.Args()
			named := false
			for _, a := range args {
				// CloseAtKey: only close_commit.lua names it.
				if s, ok := a.(string); ok && strings.Contains(s, "pca:"+h.uid+"/") {
					named = true
					break
				}
			}
			if mode, ok := args[len(args)-1].(string); named && ok && mode == "1" {
				n := h.calls.Add(1)
				if n == h.nth || h.on.Load() {
					h.fails.Add(1)
					err := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
					cmd.SetErr(err)
					return err
				}
			}
		}
		return next(ctx, cmd)
	}
}

// TestAttack1201dRoutedUndecidedShownNeverClosed: the user's device D is
// connected on instance X, silent. Close stage c (with its deadline) is
// pushed on instance P, where the user has no connection: P keeps it
// ahead in the inbox and routes it to X, and answers delivered (X's
// subscriber took it). X's delivery decides c's close, and Redis fails
// that one call. D refuses c; routedIn, unlike the push's own route,
// keeps it in the inbox (already there, kept ahead) and offers the inbox
// to D at once. The offer decides the close (applied) and shows D the
// close stage as an inbox copy, which closes nothing, and no live copy
// follows it: the one that would close D was the refused one. D is told
// the chat is closed and left open, its session alive; the consumer was
// told delivered and pushes nothing again.
func TestAttack1201dRoutedUndecidedShownNeverClosed(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	uid := "a1201d-routed-undecided"
	fail := &a1201dFailDecide{uid: uid, nth: 1}
	x := startGatewayHooked(t, []string{srv.Addr}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	}, func(g *Gateway) { g.rdb.AddHook(fail) })
	p := startGatewayOn(t, []string{srv.Addr}, prefix, nil)

	wsD := x.dial(t, uid)
	aofServed(t, wsD)
	c := stagePush(uid, redisNowMS(t, p.rdb), 2, timeoutevent.ActionClose)
	if res, err := p.pushGuide(t, c); err != nil || res.Status != push.Delivered || res.Connections != 1 {
		t.Fatalf("push c on P: %+v, %v; want delivered to X's one connection", res, err)
	}
	waitUntil(t, "X's decision of c failed", func() bool { return fail.fails.Load() == 1 })
	a1201cEachToldAndClosed(t, x, uid, c, wsD)
}

// TestAttack1201dHeldBesideUndecided: the user has two devices on this
// instance. S is connected and silent; H has just reconnected with
// first=ping and holds its guides until its first frame. Close stage c
// is pushed, and Redis fails the delivery's decision of its close. S
// refuses c; H holds it, deciding nothing: the delivery counts one
// connection that took c, so the push answers delivered and does not
// fail for the consumer to push it again. H's first frame (a ping with
// no word) ends its hold: H decides alone, applied, is written c and
// closed 4000, and proves it, which takes the entry kept ahead out of
// the inbox. S, there and silent when the chat closed, is never shown
// c nor closed: the one decision per delivery does not cover a held
// connection, which takes the guide whatever the decision would be.
func TestAttack1201dHeldBesideUndecided(t *testing.T) {
	uid := "a1201d-held-beside"
	fail := &a1201dFailDecide{uid: uid}
	tg := startGatewayHooked(t, []string{redistest.Start(t).Addr}, redistest.Prefix(t),
		slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
			c.WriteTimeout = 30 * time.Second
			c.routeRefreshEvery = time.Hour
		}, func(g *Gateway) { g.rdb.AddHook(fail) })

	wsS := tg.dial(t, uid)
	aofServed(t, wsS)
	wsH := tg.dialFirstPing(t, uid)
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	fail.on.Store(true)
	res, err := tg.pushGuide(t, c)
	fail.on.Store(false)
	if fail.fails.Load() == 0 {
		t.Fatalf("no decision of c failed (push: %+v, %v): the test's premise fails", res, err)
	}
	if err == nil && res.Status == push.Delivered {
		// H holds c: its first frame ends the hold, and c is decided
		// there, alone.
		pingSaying(t, wsH, -1)
	}
	if err != nil {
		// Failed, for the consumer to push it again, as it would.
		pingSaying(t, wsH, -1)
		if res, err = tg.pushGuide(t, c); err != nil {
			t.Fatalf("push c again: %v", err)
		}
	}
	a1201cEachToldAndClosed(t, tg, uid, c, wsH, wsS)
}

// TestAttack1201dUndecidedHereTakenElsewhere: the user has device S1 on
// instance X and device S2 on instance P, both silent. Close stage c is
// pushed on P; P's delivery decides its close, and Redis fails that one
// call: S2 refuses c. P routes c to X, whose subscriber takes it
// (remote 1), so the push answers delivered: the failure only makes a
// push fail when no connection anywhere took c. X's delivery decides
// the close (applied): S1 is written c, closed 4000, and proves it,
// which takes the entry kept ahead out of the inbox. S2, there and
// silent when the chat closed, is never shown c nor closed, and the
// consumer, told delivered, pushes nothing again. The decision is once
// per instance, not per push: a failure on one instance loses its
// devices as a failure on one connection used to.
func TestAttack1201dUndecidedHereTakenElsewhere(t *testing.T) {
	uid := "a1201d-undecided-here"
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
	if err != nil {
		// Failed, for the consumer to push it again, as it would.
		if res, err = p.pushGuide(t, c); err != nil {
			t.Fatalf("push c again: %v", err)
		}
	}
	t.Logf("push c: %+v", res)
	got := make(chan string, 2)
	for i, ws := range []*websocket.Conn{ws1, ws2} {
		name := []string{"S1 on X", "S2 on P"}[i]
		go func() { got <- name + " " + a1201dFrames(ws, c.ID) }()
	}
	seen := []string{<-got, <-got}
	for _, s := range seen {
		if !strings.HasSuffix(s, " guide,close:4000") {
			t.Errorf("%s; want the close stage's frame, then the close 4000, on each silent device (all: %v; inbox now %v)", s, seen, p.aaInboxIDs(t, uid))
		}
	}
}

// a1201dFrames reads ws until it closes or patience runs out, and says
// what it saw: "guide" for each frame of guide id, "close:<code>" for the
// close, "open" when it was left open.
func a1201dFrames(ws *websocket.Conn, id string) string {
	ws.SetReadDeadline(time.Now().Add(patience))
	var frames []string
	for {
		_, b, err := ws.ReadMessage()
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return strings.Join(append(frames, "close:"+strconv.Itoa(ce.Code)), ",")
		}
		if err != nil {
			return strings.Join(append(frames, "open"), ",")
		}
		if strings.Contains(string(b), id) {
			frames = append(frames, "guide")
		}
	}
}

// a1201dTwoInstances starts two gateway instances on one Redis, P, whose
// client runs fail, and X; neither refreshes routes on its own.
func a1201dTwoInstances(t *testing.T, fail redis.Hook) (p, x *testGateway) {
	t.Helper()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	p = startGatewayHooked(t, []string{srv.Addr}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	}, func(g *Gateway) { g.rdb.AddHook(fail) })
	x = startGatewayOn(t, []string{srv.Addr}, prefix, func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	})
	return p, x
}
