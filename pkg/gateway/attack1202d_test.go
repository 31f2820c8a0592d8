package gateway

import (
	"bytes"
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
	"github.com/stillthere/stillthere/pkg/tcpproxy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on a close stage's decision that brings when the close was
// applied in the same call (close_commit.lua, Store.CommitCloseAt,
// ApplyCloseAt).

// a1202dFailClose fails, once while armed, the next run of
// close_commit.lua for uid's closes (any mode) on the client it hooks, as
// a connection reset would.
type a1202dFailClose struct {
	uid   string
	armed atomic.Bool
	fails atomic.Int32
}

func (h *a1202dFailClose) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *a1202dFailClose) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *a1202dFailClose) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			for _, a := range cmd.Args() {
				// CloseAtKey: only close_commit.lua names it.
				if s, ok := a.(string); ok && strings.Contains(s, "pca:"+h.uid+"/") {
					if h.armed.CompareAndSwap(true, false) {
						h.fails.Add(1)
						err := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
						cmd.SetErr(err)
						return err
					}
					break
				}
			}
		}
		return next(ctx, cmd)
	}
}

// a1202dHoldPublish holds, on the client it hooks, the SPUBLISH of a
// payload naming id until release is closed; entered is closed once one
// waits there.
type a1202dHoldPublish struct {
	id      string
	entered chan struct{}
	release chan struct{}
	once    atomic.Bool
}

func (h *a1202dHoldPublish) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *a1202dHoldPublish) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *a1202dHoldPublish) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "spublish" {
			args := cmd.Args()
			var payload []byte
			switch p := args[len(args)-1].(type) {
			case []byte:
				payload = p
			case string:
				payload = []byte(p)
			}
			if bytes.Contains(payload, []byte(h.id)) && h.once.CompareAndSwap(false, true) {
				close(h.entered)
				<-h.release
			}
		}
		return next(ctx, cmd)
	}
}

// TestAttack1202dUndatedComeBackClosedOnFailedApply: the user has device
// A on instance P and device B on instance X, both silent. Close stage c,
// pushed without deadline_ms (the push contract makes it optional), is
// pushed on P. P's delivery applies its close (ApplyCloseAt: the chat is
// closed, its time kept), writes it to A, closes A 4000, and A proves it,
// which takes c's entry kept ahead out of the inbox. P's copy routed to X
// is on its way (its publish, or X's read of it, late: a pause). Then the
// user comes back on X: device N, a new connection opened after the chat
// was closed, by X's own clock of Redis. X reads the routed copy, and the
// one call that decides it for X's connections (close_commit.lua, mode
// "2") fails, once.
//
// A close without a deadline is "written all the same" when that call
// fails (commitClose: applied, appliedAt 0), and openedAfter, with no
// time, is false: N is written c and closed 4000. N opened after the
// close was applied, and docs/protocol.md has it that nothing may close
// such a connection 4000: it is the user come back. Nothing about N was
// unknown: the close's time is kept in Redis, and before the decision
// brought the time (a separate read after the decision), X read it and
// spared N; the one call now fails both at once, and the fallback for the
// decision ("written all the same") is taken for the time as well. B,
// there and silent when the chat closed, is told and closed, as it must.
func TestAttack1202dUndatedComeBackClosedOnFailedApply(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	uid := "a1202d-undated-come-back"
	c := a1201cUndated(uid, 2, timeoutevent.ActionClose)
	hold := &a1202dHoldPublish{id: c.ID, entered: make(chan struct{}), release: make(chan struct{})}
	released := false
	defer func() {
		if !released {
			close(hold.release)
		}
	}()
	fail := &a1202dFailClose{uid: uid}
	p := startGatewayHooked(t, []string{srv.Addr}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	}, func(g *Gateway) { g.rdb.AddHook(hold) })
	x := startGatewayHooked(t, []string{srv.Addr}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	}, func(g *Gateway) { g.rdb.AddHook(fail) })

	wsA := p.dial(t, uid)
	aofServed(t, wsA)
	wsB := x.dial(t, uid)
	aofServed(t, wsB)
	cB := x.hub.lookup(uid)[0]

	type result struct {
		res push.Response
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := p.pushGuide(t, c)
		done <- result{res, err}
	}()
	select {
	case <-hold.entered:
	case <-time.After(patience):
		t.Fatal("P's publish of c to X never came")
	}
	// A, there and silent, is told and closed: the chat is closed.
	readStage(t, wsA, c)
	readClose(t, wsA)
	waitUntil(t, "c's entry kept ahead out of the inbox by A's proof", func() bool { return len(p.aaInboxIDs(t, uid)) == 0 })
	at, err := p.store.CloseAppliedAt(ctx, uid, c.ID)
	if err != nil || at == 0 {
		t.Fatalf("c's close applied at %d, %v; want it applied by P's delivery", at, err)
	}

	// The user comes back on X, after the chat was closed.
	waitUntil(t, "X's clock of Redis past c's close", func() bool { return x.redisNowMS() > at+1 })
	wsN := x.dial(t, uid)
	aofServed(t, wsN)
	var cN *conn
	for _, cn := range x.hub.lookup(uid) {
		if cn != cB {
			cN = cn
		}
	}
	if cN == nil || cN.openedMS <= at {
		t.Fatalf("N opened at %v, not after c's close was applied at %d: the test's premise fails", cN, at)
	}

	// X's one decision of its routed copy fails.
	fail.armed.Store(true)
	close(hold.release)
	released = true
	r := <-done
	if r.err != nil || r.res.Status != push.Delivered {
		t.Fatalf("push c on P: %+v, %v; want delivered", r.res, r.err)
	}
	// B, there and silent when the chat closed, is owed c and the close.
	readStage(t, wsB, c)
	readClose(t, wsB)
	if fail.fails.Load() != 1 {
		t.Fatalf("X's decision of c failed %d times; want once: the test's premise fails", fail.fails.Load())
	}
	a1201eStillOpen(t, wsN, c.ID, "N, the user's connection on X opened after c's close was applied")
}

// a1202Count counts, on the client it hooks, the failed commands counts
// picks, and the failed commands naming uid's inbox once those reach
// after: that a Redis cut outlasted a retry loop and the keep after it.
// a1202Outage starts instance X, whose link to Redis runs through a
// proxy the test cuts, with hooks on its client, and instance P, linked
// directly. X sheds nothing (a slow host's outage must not shed the
// devices), and nothing offers the inbox but the test, as a route
// refresh would.
func a1202Outage(t *testing.T, hooks ...redis.Hook) (x, p *testGateway, proxy *tcpproxy.Proxy) {
	t.Helper()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	proxy, err := tcpproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	x = startGatewayHooked(t, []string{proxy.Addr()}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.ShedAfter = 0
		c.routeRefreshEvery = time.Hour
	}, func(g *Gateway) {
		for _, h := range hooks {
			g.rdb.AddHook(h)
		}
	})
	p = startGatewayOn(t, []string{srv.Addr}, prefix, func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour
	})
	return x, p, proxy
}

// a1202OldTries is how many times redeliverUndecided once tried a close
// stage before keeping it: an outage past them is what these tests cut.
const a1202OldTries = 6

type a1202Count struct {
	uid        string
	after      int32
	counts     func(cmd redis.Cmder) bool
	fails      atomic.Int32
	inboxFails atomic.Int32
}

// namesCloseCommit picks the runs of close_commit.lua for uid's closes
// (only it names their CloseAtKey).
func namesCloseCommit(uid string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		if name := cmd.Name(); name != "evalsha" && name != "eval" {
			return false
		}
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.Contains(s, "pca:"+uid+"/") {
				return true
			}
		}
		return false
	}
}

// namesCloseAtGet picks the reads of when a close of uid was applied.
func namesCloseAtGet(uid string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		if cmd.Name() != "get" {
			return false
		}
		k, ok := cmd.Args()[1].(string)
		return ok && acNamesCloseAt(k, uid)
	}
}

func (h *a1202Count) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *a1202Count) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *a1202Count) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil || err == redis.Nil {
			return err
		}
		if h.counts(cmd) {
			h.fails.Add(1)
			return err
		}
		if h.fails.Load() >= h.after {
			for _, a := range cmd.Args() {
				if s, ok := a.(string); ok && strings.HasSuffix(s, "in:"+h.uid) {
					h.inboxFails.Add(1)
					break
				}
			}
		}
		return err
	}
}

// TestAttack1202dDatedCloseOutageOutlastsRetries: device D is connected on
// instance X, silent, since before the silence's deadline. Close stage c
// (with its deadline) is kept ahead by instance P and routed to X, which
// reads it while its link to Redis is down for a while (a failover's
// seconds). D refuses it for want of its close's decision, and X tries
// again (redeliverUndecided). P's push answered delivered (X took it), so
// no consumer pushes it again.
//
// When X's tries were a number (six, about 6 s), an outage longer than
// them had X keep c, which failed too: the entry P kept ahead stayed, and
// once Redis was back X's route refresh offered D that copy, whose close
// the offer applied while D was open and silent, with no live copy to
// follow and close it. D was told its chat closed and left open, its
// session alive. A close stage's guide is written, then its connection
// closed 4000 (docs/protocol.md, "Stages"). X now tries while a
// connection of the user is open there (until the shed ends them); this
// outage outlasts the old tries by two more.
func TestAttack1202dDatedCloseOutageOutlastsRetries(t *testing.T) {
	ctx := context.Background()
	uid := "a1202d-dated-outage"
	cnt := &a1202Count{uid: uid, after: 1 + a1202OldTries, counts: namesCloseCommit(uid)}
	x, p, proxy := a1202Outage(t, cnt)

	wsD := x.dial(t, uid) // there, silent
	aofServed(t, wsD)
	cD := x.hub.lookup(uid)[0]
	deadline := redisNowMS(t, p.rdb)
	if cD.openedMS > deadline {
		t.Fatalf("D opened at %d, after the deadline %d: the test's premise fails", cD.openedMS, deadline)
	}
	c := stagePush(uid, deadline, 2, timeoutevent.ActionClose)
	p.aofKeepAhead(t, c) // P's route: kept ahead, then routed to X

	// X reads the routed copy while its Redis link is down, and stays down
	// past the tries X once made: until X has tried to keep it, or tried
	// it twice more.
	proxy.Cut()
	x.run.Tolerate()
	x.readRouted(t, c)
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
	a1201cWantClosed(t, wsD, "D, connected and silent since before c's deadline, its close applied while it was,")
}
