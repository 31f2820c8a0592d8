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
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Final review of the resync turning the sign of the grants it wrote
// back (resyncConns' CompareAndSwap(raw, -raw)). Both tests failed on
// it; the turn is gone: unwrittenHere asks instead whether a ping of the
// user came after the close's deadline and Redis's last renewal of the
// user is no later than the deadline, which neither a later ping nor a
// failed batch fools.

// rfHook fails the renewal script runs (any mode) of the users marked
// failing, counts the resync runs it failed for v, and, once armed,
// holds the first resync run that wrote u's grant (after Redis took it)
// until the test releases it: the moment between the resync's capture
// of the grant and its CompareAndSwap.
type rfHook struct {
	names        map[string]string
	u, v         string
	failU, failV atomic.Bool
	resyncFailsV atomic.Int32
	pauseU       atomic.Bool
	paused       chan struct{}
	release      chan struct{}
}

func newRFHook(u, v string) *rfHook {
	return &rfHook{names: session.ScriptNames(), u: u, v: v, paused: make(chan struct{}), release: make(chan struct{})}
}

func (h *rfHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *rfHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *rfHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		wroteU := false
		for _, cmd := range cmds {
			if acScriptOf(h.names, cmd) != "renew" {
				continue
			}
			resync, isU, isV := false, false, false
			for _, a := range cmd.Args() {
				s, ok := a.(string)
				if !ok {
					continue
				}
				if s == "resync" || s == "lapsed" {
					resync = true
				}
				isU = isU || strings.HasSuffix(s, ":"+h.u)
				isV = isV || strings.HasSuffix(s, ":"+h.v)
			}
			if (isU && h.failU.Load()) || (isV && h.failV.Load()) {
				if resync && isV {
					h.resyncFailsV.Add(1)
				}
				e := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
				cmd.SetErr(e)
				if err == nil {
					err = e
				}
				continue
			}
			if resync && isU && cmd.Err() == nil {
				wroteU = true
			}
		}
		if wroteU && h.pauseU.CompareAndSwap(true, false) {
			close(h.paused)
			select {
			case <-h.release:
			case <-time.After(2 * patience):
			}
		}
		return err
	}
}

func rfStart(t *testing.T, h *rfHook, cfg func(*Config)) *testGateway {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	x := startGatewayHooked(t, []string{srv.Addr}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.ShedAfter = 0
		c.routeRefreshEvery = time.Hour
		if cfg != nil {
			cfg(c)
		}
	}, func(g *Gateway) { g.rdb.AddHook(h) })
	x.run.Tolerate()
	return x
}

// TestReviewFinalPingDuringResyncMarkedWritten: with no jitter (a valid
// policy: every ping of a segment is granted the same TTL), u pings once
// on U while u's renewal fails (ping 1), and a resync writes ping 1
// back. Between the resync's capture of U's grant and its
// CompareAndSwap, u pings again (ping 2, at a time after the deadline D
// of a close stage), and ping 2's renewal fails, as do the resyncs for u
// after it. Ping 2's grant is the same number as ping 1's, so the
// CompareAndSwap of ping 1's grant turns ping 2's: "written", though
// Redis knows only ping 1. The close stage of deadline D (after ping 1,
// before ping 2) is pushed: u pinged after D, and Redis does not know it
// yet, so it must be refused (409) or cancelled, never delivered; and
// ping 2's grant must stay negative until a resync writes it.
//
// Failed on the second: ping 2's grant was turned positive. The push
// itself was answered stale (the push's own check found U's ping after
// D in Redis), so the harm shown was the broken invariant, not a close
// delivered to U.
func TestReviewFinalPingDuringResyncMarkedWritten(t *testing.T) {
	u, v := "rf-aba-u", "rf-aba-v"
	h := newRFHook(u, v)
	x := rfStart(t, h, func(c *Config) { c.SessionJitter = 0 })
	wsU := x.dial(t, u)
	aofServed(t, wsU)
	wsV := x.dial(t, v)
	aofServed(t, wsV)
	cU := x.hub.lookup(u)[0]

	h.failU.Store(true)
	pingSaying(t, wsU, -1) // ping 1
	a1202eUnavailable(t, wsU)
	h.failU.Store(false)
	waitUntil(t, "a resync owed after ping 1 failed", x.reach.resyncOwed)
	raw1 := cU.grant.Load()

	h.pauseU.Store(true)
	pingSaying(t, wsV, -1) // heals the instance: the resync runs
	a1202gUntilPong(t, wsV, "V")
	select {
	case <-h.paused:
	case <-time.After(patience):
		t.Fatal("no resync wrote u's grant back")
	}
	// Redis took ping 1; the resync has not turned any sign yet.
	deadline := redisNowMS(t, x.rdb)
	waitUntil(t, "Redis's clock past D, for ping 2 strictly after it", func() bool { return redisNowMS(t, x.rdb) > deadline })
	h.failU.Store(true) // ping 2's renewal fails, and any resync of u after
	at1 := cU.pingAt.Load()
	pingSaying(t, wsU, -1) // ping 2
	waitUntil(t, "ping 2 recorded on U", func() bool { return cU.pingAt.Load() != at1 })
	raw2 := cU.grant.Load()
	close(h.release)
	a1202eUnavailable(t, wsU)
	waitUntil(t, "a resync owed after ping 2 failed", x.reach.resyncOwed)
	waitUntil(t, "the resync that wrote ping 1 back done with U", func() bool { return cU.grant.Load() != raw2 || x.reach.resyncOwed() })

	c := stagePush(u, deadline, 2, timeoutevent.ActionClose)
	res, err := x.pushGuide(t, c)
	if err == nil && res.Status == push.Delivered {
		t.Fatalf("u's close stage of deadline %d delivered (%+v) though u pinged after it (ping 2, whose renewal failed and no resync "+
			"wrote back): ping 1's grant %d and ping 2's %d are the same number, and the resync's CompareAndSwap of ping 1's turned ping 2's "+
			"(now %d, resync owed %v): unwrittenHere no longer refuses, and a user who pinged is closed 4000",
			deadline, res, raw1, raw2, cU.grant.Load(), x.reach.resyncOwed())
	}
	if g := cU.grant.Load(); g > 0 {
		t.Fatalf("ping 2's grant %d counts as written though its renewal failed and no resync wrote it (close push: %+v, %v)", g, res, err)
	}
}

// TestReviewFinalOtherUsersFailureInBatchKeepsUnwritten: u pings once on
// U while u's renewal fails, and goes silent; before any resync
// completes, another user v's renewals on the instance fail for good (a
// cluster slot down). u's keys answer again: every resync writes u's
// ping back (Redis has it), but fails on v's grant in the same batch, and
// the batch's error keeps the CompareAndSwap from turning u's sign. u's
// close stage (deadline after the written-back ping) is then refused
// (409) for as long as v fails, though Redis knows u's last ping and u
// is silent since; a 409 is retried without end (it never counts against
// the consumer's breaker). Pushed at the consumer's pace for 10s.
func TestReviewFinalOtherUsersFailureInBatchKeepsUnwritten(t *testing.T) {
	u, v := "rf-batch-u", "rf-batch-v"
	h := newRFHook(u, v)
	x := rfStart(t, h, nil)
	wsU := x.dial(t, u)
	aofServed(t, wsU)
	wsV := x.dial(t, v)
	aofServed(t, wsV)
	cU := x.hub.lookup(u)[0]
	before, _ := x.store.LastRenewed(context.Background(), u)

	h.failU.Store(true)
	h.failV.Store(true)
	pingSaying(t, wsU, -1)
	a1202eUnavailable(t, wsU)
	pingSaying(t, wsV, -1)
	a1202eUnavailable(t, wsV)
	h.failU.Store(false)
	waitUntil(t, "a resync that wrote u's ping back", func() bool {
		r, err := x.store.LastRenewed(context.Background(), u)
		return err == nil && r.After(before)
	})
	n := h.resyncFailsV.Load()
	waitUntil(t, "a later resync that failed on v's grant", func() bool { return h.resyncFailsV.Load() > n })

	c := stagePush(u, redisNowMS(t, x.rdb), 2, timeoutevent.ActionClose)
	res, tries, status, last := a1202gPushAsConsumer(t, x, c)
	if last != nil {
		t.Fatalf("u's close stage, pushed %d times over 10s, refused every time (HTTP %v; last: %v), though every resync wrote u's ping "+
			"back: the batch's error (v's grant) keeps u's sign negative (grant %d, resync owed %v); the 409 is retried without end",
			tries, status, last, cU.grant.Load(), x.reach.resyncOwed())
	}
	if res.Status != push.Delivered {
		t.Fatalf("push of u's close stage: %+v; want delivered to U", res)
	}
	readStage(t, wsU, c)
	readClose(t, wsU)
}
