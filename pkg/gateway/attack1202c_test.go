package gateway

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on a close stage's delivery when Redis fails around the time
// its close was applied. They were written against a delivery that
// refused itself when it could not read that time (closeDecision's
// unknownFor, since removed: the decision brings the time in one call,
// close_commit.lua), and keep their interleavings and hooks.

// TestAttack1202cUnreadRefusedDeviceNeverTold: the user has device A on
// instance X, open since before the silence's deadline, and device B on
// instance P, opened after the deadline (a reconnect: connecting opens no
// session), both silent. Close stage c is pushed on P, whose delivery
// decides c's close (applied: the chat is closed, B open and silent at
// that moment); the hook fails a separate read of when it was applied,
// should one come. X's routed copy decides for itself: A is written c,
// closed 4000, and proves it, which takes c's entry kept ahead out of the
// inbox. The user then pings on B.
//
// B, open and silent when the chat was closed, is owed c and the close
// whatever it pinged since (docs/protocol.md). A delivery refused on B
// would be lost: the consumer judges each attempt afresh (pkg/guide:
// needless), finds the session live after the ping, and settles c stale,
// and A's proof took the entry out of the inbox. So B must be written c
// and closed with A, in the same push, whether or not Redis answers.
func TestAttack1202cUnreadRefusedDeviceNeverTold(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail bool
	}{
		{"Redis answers", false},
		{"the applied time's read fails", true},
	} {
		t.Run(tc.name, func(t *testing.T) { a1202cUnreadRefused(t, tc.fail) })
	}
}

func a1202cUnreadRefused(t *testing.T, fail bool) {
	ctx := context.Background()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	uid := "a1202c-unread-never-told"
	get := &a1202bFail{uid: uid}
	p := startGatewayHooked(t, []string{srv.Addr}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	}, func(g *Gateway) { g.rdb.AddHook(get) })
	x := startGatewayOn(t, []string{srv.Addr}, prefix, func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	})

	wsA := x.dial(t, uid)
	aofServed(t, wsA)
	deadline := redisNowMS(t, p.rdb)
	// B opens after the deadline, by P's own clock of Redis.
	waitUntil(t, "P's clock of Redis past the deadline", func() bool { return p.redisNowMS() > deadline+1 })
	wsB := p.dial(t, uid)
	aofServed(t, wsB)
	cB := p.hub.lookup(uid)[0]
	if cB.openedMS <= deadline {
		t.Fatalf("B opened at %d, not after the deadline %d: the test's premise fails", cB.openedMS, deadline)
	}

	c := stagePush(uid, deadline, 2, timeoutevent.ActionClose)
	get.get.Store(fail) // P's read of when c's close was applied fails, once
	res, err := p.pushGuide(t, c)
	if fail && get.getFails.Load() == 0 {
		// The decision brings the time in one call (close_commit.lua): no
		// separate read is left to fail. The hook stays armed.
		t.Log("no separate read of c's applied time: it came with the close's decision")
	}
	if err == nil {
		// Settled in this push: both devices told and closed.
		if res.Status != push.Delivered || res.Connections != 2 {
			t.Fatalf("push c on P: %+v; want delivered to B here and A on X", res)
		}
		readStage(t, wsA, c)
		readClose(t, wsA)
		if got := a1201dFrames(wsB, c.ID); got != "guide,close:4000" {
			t.Errorf("B saw %q; want c's frame, then the close 4000", got)
		}
		return
	}
	if !fail {
		t.Fatalf("push c on P, Redis answering: %v", err)
	}
	// Refused, for its consumer to push again.
	// A, there and silent, is told and closed: the chat is closed.
	readStage(t, wsA, c)
	readClose(t, wsA)
	waitUntil(t, "c's entry kept ahead out of the inbox by A's proof", func() bool { return len(p.aaInboxIDs(t, uid)) == 0 })
	at, err := p.store.CloseAppliedAt(ctx, uid, c.ID)
	if err != nil || at == 0 {
		t.Fatalf("c's close applied at %d, %v; want it applied by P's delivery", at, err)
	}
	if cB.openedMS > at {
		t.Fatalf("B opened at %d, after c's close was applied at %d: the test's premise fails", cB.openedMS, at)
	}

	// The user pings on B before the consumer tries c again.
	pingPong(t, wsB)

	// The consumer's attempt, as pkg/guide makes it: the session checked
	// first (needless), and c pushed again only if the silence is not over.
	chk, err := p.store.Check(ctx, uid)
	if err != nil {
		t.Fatal(err)
	}
	stale := chk.Live || chk.Renewed.After(time.UnixMilli(deadline))
	if !stale {
		if res, err := p.pushGuide(t, c); err != nil {
			t.Fatalf("the consumer's retry of c: %+v, %v", res, err)
		}
	}
	if got := a1201dFrames(wsB, c.ID); got != "guide,close:4000" {
		t.Errorf("B, open since %d, before c's close was applied at %d, its user silent then, saw %q after A was told and closed "+
			"(the consumer's retry settled stale: %v; inbox now %v); want c's frame, then the close 4000",
			cB.openedMS, at, got, stale, p.aaInboxIDs(t, uid))
	}
}

// TestAttack1202cUndatedCloseOutageOutlastsRetries: device D is connected
// on instance X, silent. Close stage c, pushed without deadline_ms, is
// kept ahead by instance P and routed to X, which reads it while its link
// to Redis is down, for a while: a failover's seconds. Nothing can cancel
// a close without a deadline, so it is written all the same when Redis
// fails (TestAttack1201cUndatedCloseRedisBlipNeverClosed: a refusal left
// D shown the close by a later offer and never closed). A delivery that
// refused it instead, trying again until its tries are spent and then
// failing to keep it, would bring that outcome back for any outage longer
// than the tries: D shown c by the route refresh's offer once Redis is
// back, and left open. D must be written c and closed 4000.
func TestAttack1202cUndatedCloseOutageOutlastsRetries(t *testing.T) {
	ctx := context.Background()
	uid := "a1202c-undated-outage"
	cnt := &a1202Count{uid: uid, after: 1 + a1202OldTries, counts: namesCloseAtGet(uid)}
	x, p, proxy := a1202Outage(t, cnt)

	wsD := x.dial(t, uid) // there, silent
	aofServed(t, wsD)
	cD := x.hub.lookup(uid)[0]
	c := a1201cUndated(uid, 2, timeoutevent.ActionClose)
	p.aofKeepAhead(t, c) // P's route: kept ahead, then routed to X

	// X reads the routed copy while its Redis link is down, and stays down
	// past the tries X once made.
	proxy.Cut()
	x.run.Tolerate()
	x.readRouted(t, c)
	// Written at once (and D closed), or tried again, each try failing to
	// read when its close was applied, until it is kept (which fails) or
	// tried twice more than X once did.
	waitUntil(t, "D written c, or X's keep of c tried, or X's tries of c past the old number", func() bool {
		return cD.isClosed() || cnt.fails.Load() >= 1+a1202OldTries && cnt.inboxFails.Load() >= 1 ||
			cnt.fails.Load() >= 3+a1202OldTries
	})
	proxy.Restore()
	waitUntil(t, "X reaches Redis again", func() bool { return x.rdb.Ping(ctx).Err() == nil })

	// X's route refresh offers the inbox to its connections.
	x.offerInbox(ctx, uid)
	readStage(t, wsD, c)
	aaAck(t, wsD, c.ID)
	a1201cWantClosed(t, wsD, "D, connected and silent when the close stage without deadline_ms came,")
}
