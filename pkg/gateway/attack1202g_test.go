package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on commitClose's refusal while a ping of the user may be
// unwritten (Gateway.unwrittenHere): the refusal asks two things, a
// resync owed by the instance (for anyone) and a connection of the user
// whose grant is negative. The resync wrote every connection's last
// grant back but did not turn its sign: a user whose last ping failed
// kept a negative grant after the resync wrote it, for as long as they
// stayed silent, and any later failure of the instance, for any user,
// made it "unwritten" again. Now a ping counts only if it came after the
// close's deadline and Redis's last renewal of the user is no later than
// the deadline: what the decision would miss.

// a1202gFailRenew fails, on the client it hooks, every renewal script
// run (renew.lua, any mode: a ping's renewal or a resync's write-back)
// of the users marked failing, as a cluster slot whose master is down
// fails the keys it holds while the others answer. It counts the
// resync's runs it failed.
type a1202gFailRenew struct {
	names        map[string]string
	u, v         string
	failU, failV atomic.Bool
	// unsentU fails u's runs before they reach Redis (a write that never
	// landed), not after (a reply lost): the whole round trip fails.
	unsentU      atomic.Bool
	resyncFailsV atomic.Int32
}

func (h *a1202gFailRenew) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *a1202gFailRenew) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *a1202gFailRenew) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.unsentU.Load() && slices.ContainsFunc(cmds, func(cmd redis.Cmder) bool {
			return acScriptOf(h.names, cmd) == "renew" && slices.ContainsFunc(cmd.Args(), func(a any) bool {
				s, ok := a.(string)
				return ok && strings.HasSuffix(s, ":"+h.u)
			})
		}) {
			e := &net.OpError{Op: "write", Net: "tcp", Err: errors.New("connection reset by peer")}
			for _, cmd := range cmds {
				cmd.SetErr(e)
			}
			return e
		}
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if acScriptOf(h.names, cmd) != "renew" {
				continue
			}
			resync, fail := false, false
			for _, a := range cmd.Args() {
				s, ok := a.(string)
				if !ok {
					continue
				}
				if s == "resync" || s == "lapsed" {
					resync = true
				}
				if (h.failU.Load() && strings.HasSuffix(s, ":"+h.u)) || (h.failV.Load() && strings.HasSuffix(s, ":"+h.v)) {
					fail = true
				}
			}
			if !fail {
				continue
			}
			if resync && h.failV.Load() {
				h.resyncFailsV.Add(1)
			}
			e := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
			cmd.SetErr(e)
			if err == nil {
				err = e
			}
		}
		return err
	}
}

// a1202gUntilPong reads ws until a pong.
func a1202gUntilPong(t *testing.T, ws *websocket.Conn, what string) {
	t.Helper()
	for deadline := time.Now().Add(patience); time.Now().Before(deadline); {
		m := readJSON(t, ws)
		if m["type"] == "pong" {
			return
		}
		if m["type"] == frame.TypeError && m["code"] == frame.CodeUnavailable {
			t.Fatalf("%s: ping answered unavailable; want a pong", what)
		}
	}
	t.Fatalf("%s: no pong", what)
}

// a1202gStaleGrant sets up instance X with the user's device U and
// another user's device V, both there. U pings once while its renewal
// fails (answered unavailable), then goes silent; V's next ping renews,
// which heals the instance, and the resync writes U's grant back: no
// resync is owed any more, U's last ping is in Redis, and U's grant is
// still negative (the resync does not turn it). Then V's renewals fail
// for good (its
// key's slot down), and V pings once: a resync is owed again, and every
// resync fails on V's grant. Returns X, U's socket, and the hook.
func a1202gStaleGrant(t *testing.T, u, v string) (x *testGateway, wsU *websocket.Conn, h *a1202gFailRenew, wsV *websocket.Conn) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	h = &a1202gFailRenew{names: session.ScriptNames(), u: u, v: v}
	x = startGatewayHooked(t, []string{srv.Addr}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.ShedAfter = 0
		c.routeRefreshEvery = time.Hour
		// Each later ping's grant ends later: a resync keeps the later
		// deadline it finds, and (u not between stages in Redis, the
		// close stages here being pushed by the test) would not record a
		// ping whose jittered grant ends earlier than the last one's.
		c.SessionJitter = 0
	}, func(g *Gateway) { g.rdb.AddHook(h) })
	x.run.Tolerate()

	wsU = x.dial(t, u)
	aofServed(t, wsU)
	wsV = x.dial(t, v)
	aofServed(t, wsV)
	cU := x.hub.lookup(u)[0]

	h.failU.Store(true)
	pingSaying(t, wsU, -1)
	a1202eUnavailable(t, wsU)
	h.failU.Store(false)
	waitUntil(t, "a resync owed after U's failed renewal", x.reach.resyncOwed)
	// V's renewal succeeds: the instance heals, and the resync writes
	// U's grant back.
	pingSaying(t, wsV, -1)
	a1202gUntilPong(t, wsV, "V")
	waitUntil(t, "the resync after U's failed renewal completed", func() bool { return !x.reach.resyncOwed() })
	renewed, err := x.store.LastRenewed(context.Background(), u)
	if err != nil || renewed.IsZero() {
		t.Fatalf("U's last renewal in Redis after the resync: %v, %v; want the ping written back", renewed, err)
	}
	_ = cU

	// V's key fails from now on: a resync is owed, and each one fails.
	h.failV.Store(true)
	pingSaying(t, wsV, -1)
	a1202eUnavailable(t, wsV)
	waitUntil(t, "a resync owed after V's failed renewal", x.reach.resyncOwed)
	return x, wsU, h, wsV
}

// TestAttack1202gStaleGrantCloseRefusedWhileAnotherUserFails: device U of
// user u is connected on instance X. u pinged once while u's renewal
// failed, and went silent; the resync after it wrote that ping back to
// Redis, so Redis knows u's last ping, and u's silence since is real.
// Then another user's renewals on X fail for good (their key's cluster
// slot down; every resync fails on their grant), while u's keys and the
// close decisions answer. The close stage of u's silence since the
// written-back ping is pushed to X, as the guide consumer does, and
// pushed again on every refusal. It is refused every time (503, which
// the consumer counts against its breaker, the one in front of every
// user's guides): unwrittenHere finds a resync owed (the other user's)
// and u's grant negative (the resync wrote it, but never turns its
// sign). u, there and silent, is never shown the close stage nor closed
// 4000, for as long as the other user's key fails.
//
// Failed so. Now only a ping after the close's deadline that Redis has
// not heard refuses it: this one is before the deadline, and in Redis.
func TestAttack1202gStaleGrantCloseRefusedWhileAnotherUserFails(t *testing.T) {
	u, v := "a1202g-stale-u", "a1202g-stale-v"
	x, wsU, h, _ := a1202gStaleGrant(t, u, v)
	waitUntil(t, "a resync that failed on V's grant", func() bool { return h.resyncFailsV.Load() >= 1 })

	c := stagePush(u, redisNowMS(t, x.rdb), 2, timeoutevent.ActionClose)
	res, tries, status, last := a1202gPushAsConsumer(t, x, c)
	if last != nil {
		t.Fatalf("u's close stage, pushed %d times over 10s, refused every time (HTTP %v; last: %v), while u's last ping is in Redis "+
			"(the resync wrote it) and u is silent since: only another user's renewals fail (resync owed: %v, u's grant %d). "+
			"u, there and silent, is never closed; the refusals count against the consumer's breaker",
			tries, status, last, x.reach.resyncOwed(), x.hub.lookup(u)[0].grant.Load())
	}
	if res.Status != push.Delivered {
		t.Fatalf("push of u's close stage: %+v; want delivered to U", res)
	}
	readStage(t, wsU, c)
	readClose(t, wsU)
}

// a1202gPushAsConsumer pushes c to x as the guide consumer does, again
// after each refusal at its pace (50ms doubling to 2s), for 10s at most:
// many of its retries, and past its breaker's 5 in a row. It returns the
// last answer, the tries, and the HTTP status of each refusal.
func a1202gPushAsConsumer(t *testing.T, x *testGateway, c push.Request) (res push.Response, tries int, status []int, last error) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		tries++
		res, last = x.pushGuide(t, c)
		if last == nil {
			break
		}
		var pe *push.Error
		if errors.As(last, &pe) {
			status = append(status, pe.Code)
		}
		// Real time must pass: the refusal is tried over the consumer's
		// own retry schedule, as long as it would keep it up. Not an
		// assertion; no condition to wait on (nothing changes between
		// tries but the clock).
		time.Sleep(min(50*time.Millisecond<<min(tries-1, 10), 2*time.Second))
	}
	return res, tries, status, last
}

// a1202gPingAfter has u ping on U once more, after deadlineMS by Redis's
// clock, while u's renewal never reaches Redis: the ping is unwritten,
// and with V failing, no resync writes it back.
func a1202gPingAfter(t *testing.T, x *testGateway, h *a1202gFailRenew, wsU *websocket.Conn, deadlineMS int64) {
	t.Helper()
	// Well past it: the resync writes the ping back at its time as this
	// instance estimates it, a few milliseconds either way.
	waitUntil(t, "Redis's clock past the close's deadline", func() bool { return redisNowMS(t, x.rdb) > deadlineMS+200 })
	h.unsentU.Store(true)
	pingSaying(t, wsU, -1)
	a1202eUnavailable(t, wsU)
	h.unsentU.Store(false)
}

// TestAttack1202gStaleGrantRefusalIsUsersNotGateways: as above, and u
// pings once more after the close stage's deadline while u's renewal
// fails: the close is refused while that ping is unwritten (a resync is
// owed, for V). The refusal is this user's (X reaches Redis for u, and
// answers every other push), like errLateBeat's, and is a 409, which the
// consumer retries without counting it against the breaker in front of
// every user's guides. It was a 503.
func TestAttack1202gStaleGrantRefusalIsUsersNotGateways(t *testing.T) {
	u, v := "a1202g-status-u", "a1202g-status-v"
	x, wsU, h, _ := a1202gStaleGrant(t, u, v)
	c := stagePush(u, redisNowMS(t, x.rdb), 2, timeoutevent.ActionClose)
	a1202gPingAfter(t, x, h, wsU, c.DeadlineMS)
	res, err := x.pushGuide(t, c)
	var pe *push.Error
	if !errors.As(err, &pe) || pe.Status != push.Retry || pe.Code != 409 {
		t.Fatalf("push of u's close stage while u's ping after its deadline is unwritten: %+v, %v; want a 409 (this user's, not counted against the breaker)", res, err)
	}
}

// TestAttack1202gStaleGrantUndatedCloseUnaffected: as above, with the
// close stage pushed without deadline_ms: unwrittenHere is not asked for
// an undated close, which is applied whatever the user did; U is shown
// it and closed 4000. Guards that the refusal stays with dated closes.
func TestAttack1202gStaleGrantUndatedCloseUnaffected(t *testing.T) {
	u, v := "a1202g-undated-u", "a1202g-undated-v"
	x, wsU, _, _ := a1202gStaleGrant(t, u, v)
	c := a1201cUndated(u, 2, timeoutevent.ActionClose)
	if res, err := x.pushGuide(t, c); err != nil || res.Status != push.Delivered || res.Connections != 1 {
		t.Fatalf("push of u's undated close stage: %+v, %v; want delivered to U", res, err)
	}
	readStage(t, wsU, c)
	readClose(t, wsU)
}

// TestAttack1202gStaleGrantClosedOnceOtherUserHeals: the control of the
// refusal: u pings once more after the close stage's deadline while u's
// renewal fails: the close is refused while that ping is unwritten. Once
// V's renewals answer again and a resync completes (writing u's ping
// back), the close is decided: cancelled, the user came back; U is left
// open.
func TestAttack1202gStaleGrantClosedOnceOtherUserHeals(t *testing.T) {
	u, v := "a1202g-heals-u", "a1202g-heals-v"
	x, wsU, h, wsV := a1202gStaleGrant(t, u, v)
	c := stagePush(u, redisNowMS(t, x.rdb), 2, timeoutevent.ActionClose)
	a1202gPingAfter(t, x, h, wsU, c.DeadlineMS)
	if _, err := x.pushGuide(t, c); err == nil {
		t.Fatal("u's close stage decided while u's ping after its deadline is unwritten: the refusal the control is for did not happen")
	}
	// V's renewals answer again, and V's next ping heals the instance:
	// the resync follows at once, well inside u's TTL.
	h.failV.Store(false)
	pingSaying(t, wsV, -1)
	a1202gUntilPong(t, wsV, "V")
	waitUntil(t, "a resync completed once V's renewals answer", func() bool { return !x.reach.resyncOwed() })
	if res, err := x.pushGuide(t, c); err != nil || res.Status != push.Stale {
		renewed, rerr := x.store.LastRenewed(context.Background(), u)
		t.Fatalf("push of u's close stage once u's ping after its deadline is written back: %+v, %v; want stale (u came back); u's last renewal in Redis %d (%v), the deadline %d",
			res, err, renewed.UnixMilli(), rerr, c.DeadlineMS)
	}
	a1201eStillOpen(t, wsU, c.ID, "U, whose user pinged after the close's deadline")
}
