package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on a close stage held by a connection until its first ping,
// decided at its hold's end (endBegun, takeGuide with a decision of its
// own).

// a1202bFail fails, once each while armed, the next decision of uid's
// close (close_commit.lua run to decide, its mode "1") and the next read
// of when a close of uid was applied (the GET of its "pca:" key), as a
// connection reset would, on the client it hooks.
type a1202bFail struct {
	uid         string
	decide      atomic.Bool
	decideFails atomic.Int32
	get         atomic.Bool
	getFails    atomic.Int32
}

func (h *a1202bFail) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *a1202bFail) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *a1202bFail) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		reset := func() error {
			err := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
			cmd.SetErr(err)
			return err
		}
		args := cmd.Args()
		switch name := cmd.Name(); {
		case name == "get":
			if k, ok := args[1].(string); ok && acNamesCloseAt(k, h.uid) && h.get.CompareAndSwap(true, false) {
				h.getFails.Add(1)
				return reset()
			}
		case name == "evalsha" || name == "eval":
			named := false
			for _, a := range args {
				if s, ok := a.(string); ok && strings.Contains(s, "pca:"+h.uid+"/") {
					named = true
					break
				}
			}
			if mode, ok := args[len(args)-1].(string); named && ok && mode == "1" && h.decide.CompareAndSwap(true, false) {
				h.decideFails.Add(1)
				return reset()
			}
		}
		return next(ctx, cmd)
	}
}

// TestAttack1202bHeldThereDecisionFailsAtHoldEnd: the user has two
// devices on one instance, both silent. S is connected; H reconnected
// just before with first=ping, and holds its guides until its first
// frame. Close stage c is pushed: S decides its close (applied), is
// written c, closed 4000, and proves it, which takes c's entry kept ahead
// out of the inbox and marks it settled; H holds c. H was open, its user
// silent, when the chat closed: it is owed c and the close 4000, as
// TestAttack1201dHeldBesideUndecided has it, and as it gets when Redis
// answers.
//
// H's first frame, a ping with no word, ends its hold: the held copy is
// decided afresh (takeGuide with a decision of its own), and Redis fails
// that one call. H refuses c; endBegun keeps it in the inbox (keepReq),
// as for a guide routed to a user who has just left, and no one pushes it
// again: the push answered delivered long ago. The keep finds c settled
// by S's proof (duplicate) and keeps nothing: H, there and silent when
// the chat closed, is never shown c nor closed; its session goes on. Had
// S not proven yet, the keep finds the entry kept ahead, leased to H's
// own handover, which left it to the held copy: the offer after the keep
// skips it, and H is shown nothing then either; the entry waits for a
// later offer (a route refresh's), an inbox copy, which closes nothing,
// and no live copy follows it. The push's own route fails for its consumer to push again
// when a decision fails (TestAttack1201dHeldBesideUndecided), and a
// routed copy is tried again (redeliverUndecided); the hold's end has
// neither.
func TestAttack1202bHeldThereDecisionFailsAtHoldEnd(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fail       bool
		proveFirst bool // S proves c before H's hold ends
	}{
		{"Redis answers", false, true},
		{"the hold's end decision fails", true, true},
		{"the hold's end decision fails, S not proven yet", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := "a1202b-held-there-decide"
			fail := &a1202bFail{uid: uid}
			tg := startGatewayHooked(t, []string{redistest.Start(t).Addr}, redistest.Prefix(t),
				slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
					c.WriteTimeout = 30 * time.Second
					c.routeRefreshEvery = time.Hour
					c.firstPingWaitFor = time.Minute
				}, func(g *Gateway) { g.rdb.AddHook(fail) })

			wsS := tg.dial(t, uid)
			aofServed(t, wsS)
			cS := tg.hub.lookup(uid)[0]
			wsH := tg.dialFirstPing(t, uid)
			var cH *conn
			for _, cn := range tg.hub.lookup(uid) {
				if cn != cS {
					cH = cn
				}
			}
			c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
			if res, err := tg.pushGuide(t, c); err != nil || res.Status != push.Delivered || res.Connections != 2 {
				t.Fatalf("push c: %+v, %v; want delivered to S, and held by H", res, err)
			}
			if !cH.holdsGuide(c.ID) {
				t.Fatal("H does not hold c: the test's premise fails")
			}
			if tc.proveFirst {
				// S, there and silent, is told and closed: the chat is closed.
				readStage(t, wsS, c)
				readClose(t, wsS)
				waitUntil(t, "c's entry kept ahead out of the inbox by S's proof", func() bool { return len(tg.aaInboxIDs(t, uid)) == 0 })
			} else {
				waitUntil(t, "c's close applied by S", func() bool {
					at, _ := tg.store.CloseAppliedAt(context.Background(), uid, c.ID)
					return at > 0
				})
			}
			at, err := tg.store.CloseAppliedAt(context.Background(), uid, c.ID)
			if err != nil || at == 0 {
				t.Fatalf("c's close applied at %d, %v; want it applied by S", at, err)
			}
			if cH.openedMS > at {
				t.Fatalf("H opened at %d, after c's close was applied at %d: the test's premise fails", cH.openedMS, at)
			}

			// H's first frame, a ping saying nothing: its hold ends.
			fail.decide.Store(tc.fail)
			pingSaying(t, wsH, -1)
			got := a1201dFrames(wsH, c.ID)
			if tc.fail && fail.decideFails.Load() == 0 {
				t.Fatal("no decision of c failed at H's hold's end: the test's premise fails")
			}
			if !tc.proveFirst {
				readStage(t, wsS, c)
				readClose(t, wsS)
			}
			if got != "guide,close:4000" {
				t.Errorf("H, open since before c's close was applied at %d (opened at %d), its user silent then, saw %q; "+
					"want c's frame, then the close 4000 (inbox now %v)", at, cH.openedMS, got, tg.aaInboxIDs(t, uid))
			}
		})
	}
}

// TestAttack1202bComeBackAppliedTimeUnread: the user has device S2 on
// instance P and device D on instance X, both silent. Close stage c is
// pushed on P: S2 decides its close (applied), is written c, closed 4000,
// and proves it. X's decision of its routed copy fails (Redis, for a
// moment), and X tries again later (redeliverUndecided). Meanwhile the
// user comes back on X, after the chat was closed: device B, a new
// connection, which pings. Redis comes back, but for one read: when c's
// close was applied. D, there and silent when the chat closed, is owed c
// and the close; B is the user come back, starting a new session, and
// nothing may close it 4000 (closeDecision.openedAfter; docs/protocol.md,
// "Stages"). With the time read, B is spared (TestAttack1201eRoutedRetry
// ClosesUserComeBack, TestAttack1202HeldComeBackClosedByRoutedRetry).
//
// With that one read failing, the decision's appliedAt is 0, openedAfter
// is false, and B is written c and closed 4000: as a live copy on X's
// retry when B does not hold its guides, and as its held copy at its
// hold's end when it does (first=ping; the hold's end now decides with a
// decision of its own, which reads the time once, and closes when it
// cannot). Nothing about B is unknown: it opened after the close by its
// own clock of Redis, and the close's time is kept; only the read failed,
// and a failed read of a decision refuses the guide (and tries again)
// where a failed read of its time closes the user who came back.
// Since a close's decision brings when it was applied, in one call
// (close_commit.lua), no separate read of that time is left on this
// path; the test keeps the interleaving and its armed hook, so that a
// separate read brought back, and failing, is caught.
func TestAttack1202bComeBackAppliedTimeUnread(t *testing.T) {
	for _, tc := range []struct {
		name string
		held bool
	}{
		{"its retry reaches B live", false},
		{"B holds its retry until its first ping", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := "a1202b-come-back-unread"
			get := &a1202bFail{uid: uid}
			x, _, wsD, cD, fail, c, at := a1202RetryPending(t, uid, get)

			// The user comes back on X, after the chat was closed.
			var wsB = x.dial
			if tc.held {
				wsB = x.dialFirstPing
			}
			ws := wsB(t, uid)
			cB := a1202CameBack(t, x, uid, cD, at)
			if !tc.held {
				aofServed(t, ws)
				pingPong(t, ws)
				// A read of the time by the retry's decision would fail.
				get.get.Store(true)
			}
			fail.on.Store(false) // X's next retry of c decides
			// D, there and silent when the chat closed, is owed c and the close.
			readStage(t, wsD, c)
			readClose(t, wsD)
			if tc.held {
				waitUntil(t, "X's retry of c held by B", func() bool { return cB.holdsGuide(c.ID) })
				// Its hold's end decides c afresh: a read of the time
				// there would fail.
				get.get.Store(true)
			}
			a1201eStillOpen(t, ws, c.ID, "B, the user's connection on X made after the chat closed, and pinged on")
			if get.getFails.Load() == 0 {
				// The decision brings the time in one call (close_commit.lua):
				// no separate read is left to fail. The hook stays armed.
				t.Log("no separate read of c's applied time: it came with the close's decision")
			}
		})
	}
}
