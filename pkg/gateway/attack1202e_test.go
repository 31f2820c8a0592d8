package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on redeliverUndecided as a loop that lasts the outage: a close
// stage routed to an instance whose decision of it fails (Redis out of
// reach) is tried again while the user's connections there stay, and is
// decided the moment Redis answers again.

// a1202eSlowResync holds, on the client it hooks, the resync's renewals
// of uid (renew.lua run in mode resync or lapsed: the grants of pings
// that could not be written during an outage, written back after it)
// while armed, until release is closed, or patience runs out: a resync
// that comes after the first decision of a close once Redis is back, as
// one does on an instance with many users to write back, or whose
// heartbeat (which starts it) comes after the retry. It counts the runs
// of close_commit.lua for uid that succeeded while armed (decided).
type a1202eSlowResync struct {
	names   map[string]string
	uid     string
	armed   atomic.Bool
	held    atomic.Int32
	decided atomic.Int32
	release chan struct{}
	once    sync.Once
}

func (h *a1202eSlowResync) open() { h.once.Do(func() { close(h.release) }) }

func (h *a1202eSlowResync) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *a1202eSlowResync) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.Load() && slices.ContainsFunc(cmds, h.resyncOfUser) {
			h.held.Add(1)
			select {
			case <-h.release:
			case <-time.After(patience):
			}
		}
		return next(ctx, cmds)
	}
}

func (h *a1202eSlowResync) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && h.armed.Load() && namesCloseCommit(h.uid)(cmd) {
			h.decided.Add(1)
		}
		return err
	}
}

// resyncOfUser reports whether cmd is a resync's renewal of uid.
func (h *a1202eSlowResync) resyncOfUser(cmd redis.Cmder) bool {
	if acScriptOf(h.names, cmd) != "renew" {
		return false
	}
	resync, user := false, false
	for _, a := range cmd.Args() {
		s, ok := a.(string)
		if !ok {
			continue
		}
		if s == "resync" || s == "lapsed" {
			resync = true
		}
		if strings.HasSuffix(s, ":"+h.uid) {
			user = true
		}
	}
	return resync && user
}

// a1202eUnavailable reads ws until the error frame that answers a ping
// whose renewal could not be written (Redis out of reach).
func a1202eUnavailable(t *testing.T, ws *websocket.Conn) {
	t.Helper()
	for deadline := time.Now().Add(patience); time.Now().Before(deadline); {
		m := readJSON(t, ws)
		if m["type"] == frame.TypeError && m["code"] == frame.CodeUnavailable {
			return
		}
		if m["type"] == "guide" || m["type"] == "pong" {
			t.Fatalf("a ping while Redis is out of reach was answered %v; want the error %q", m, frame.CodeUnavailable)
		}
	}
	t.Fatalf("no error %q answered the ping", frame.CodeUnavailable)
}

// TestAttack1202eCameBackDuringOutageClosedByRetry: device D is
// connected on instance X, silent, since before the silence's deadline.
// Close stage c is kept ahead by instance P (where the user has no
// connection) and routed to X, which reads it while its link to Redis is
// cut: D refuses it for want of its close's decision, and X tries again
// for as long as the outage lasts (redeliverUndecided), here past the six
// tries it once made. Nothing has applied c's close yet. While Redis is
// out of reach, the user comes back: they ping on D (or on a new
// connection B they open on X), and X answers "unavailable"; the ping's
// grant is kept for the resync after the outage ("The time it could not
// renew does not count toward your silence", docs/protocol.md, 1013; "A
// ping at any point cancels the stages left", "Stages").
//
// Redis comes back. The first decision of c's close after it (the offer
// of the inbox that X's re-registration makes once its heartbeat gets
// through, or the loop's next try) is made from Redis alone, where the
// user's last renewal is still the one before the deadline: the resync
// that writes back the ping comes after that same heartbeat and writes
// every connection of the instance. The close is applied; D (or B) is
// shown the inbox copy, and the loop's live copy then closes it 4000
// (closesAfterCopy): the user who pinged is told their chat was closed
// for inactivity and cut off, and with B, D is closed too. X knew (the
// ping after c's deadline, held for the resync) what Redis did not yet.
// The hook only makes the resync come after the first decision, which it
// also does on its own in most runs here; with the resync first, the
// decision is cancelled and the connection left alone, as it must be.
//
// Not only this change's: with the six tries, X kept c and the
// re-registration's offer decided the close the same way and showed the
// inbox copy (guide, pong, open); with the loop that lasts the outage,
// its live copy closed the user who came back as well (guide, pong,
// close 4000). Now no close is decided on an instance that holds a ping
// of the user Redis may not have, until its resync has written it back
// (Gateway.unwrittenHere): the decision then finds the user came back.
func TestAttack1202eCameBackDuringOutageClosedByRetry(t *testing.T) {
	for _, tc := range []struct {
		name  string
		onNew bool
	}{
		{"on D", false},
		{"on a new connection", true},
	} {
		t.Run(tc.name, func(t *testing.T) { a1202eCameBackDuringOutage(t, tc.onNew) })
	}
}

// a1202eCameBackDuringOutage runs the come-back during X's outage: the
// user pings on D, or on a new connection B opened on X during the
// outage (onNew).
func a1202eCameBackDuringOutage(t *testing.T, onNew bool) {
	ctx := context.Background()
	uid := "a1202e-came-back-outage"
	cnt := &a1202Count{uid: uid, after: 1 + a1202OldTries, counts: namesCloseCommit(uid)}
	slow := &a1202eSlowResync{names: session.ScriptNames(), uid: uid, release: make(chan struct{})}
	t.Cleanup(slow.open)
	x, p, proxy := a1202Outage(t, cnt, slow)

	wsD := x.dial(t, uid) // there, silent
	aofServed(t, wsD)
	cD := x.hub.lookup(uid)[0]
	deadline := redisNowMS(t, p.rdb)
	if cD.openedMS > deadline {
		t.Fatalf("D opened at %d, after the deadline %d: the test's premise fails", cD.openedMS, deadline)
	}
	c := stagePush(uid, deadline, 2, timeoutevent.ActionClose)
	p.aofKeepAhead(t, c) // P's route: kept ahead, then routed to X

	proxy.Cut()
	x.run.Tolerate()
	x.readRouted(t, c)
	// The outage lasts past the tries X once made: until X has tried to
	// keep c, or tried it twice more.
	waitUntil(t, "X's keep of c tried, or X's tries of c past the old number", func() bool {
		return cnt.fails.Load() >= 1+a1202OldTries && cnt.inboxFails.Load() >= 1 || cnt.fails.Load() >= 3+a1202OldTries
	})

	// The user comes back, after c's deadline, while X cannot reach
	// Redis: a ping, answered "unavailable".
	waitUntil(t, "X's clock past c's deadline", func() bool { return time.Now().UnixMilli() > deadline+50 })
	wsB, back := wsD, "D, on which the user pinged after c's deadline, before any connection wrote c (its ping's grant held in the outage)"
	if onNew {
		wsB = x.dial(t, uid)
		back = "B, the user's connection opened during the outage and pinged on, before any connection wrote c"
	}
	pingSaying(t, wsB, -1)
	a1202eUnavailable(t, wsB)
	if cD.isClosed() {
		t.Fatal("D closed during the outage: the test's premise fails")
	}

	slow.armed.Store(true)
	proxy.Restore()
	waitUntil(t, "X reaches Redis again", func() bool { return x.rdb.Ping(ctx).Err() == nil })
	// X's next try, or the resync, whichever comes; then the resync.
	waitFor(patience, func() bool { return slow.decided.Load() > 0 || cD.isClosed() })
	slow.open()

	a1202eLeftAlone(t, wsB, c.ID, back)
	if onNew {
		a1202eLeftAlone(t, wsD, c.ID, "D, its user back on B before any connection wrote c")
	}
}

// a1202eLeftAlone is a1201eStillOpen, which on failure reads on until
// the connection closes (or a few seconds pass), so that it says all
// the connection was shown: the close stage's frame, and whether the
// close 4000 followed it.
func a1202eLeftAlone(t *testing.T, ws *websocket.Conn, id, what string) {
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
			seen = append(seen, "close:"+strconv.Itoa(ce.Code))
		case err != nil && len(seen) > 0:
			seen = append(seen, "open")
		case err != nil:
			t.Fatalf("%s: read %v; want a pong", what, err)
		case strings.Contains(string(b), `"pong"`):
			seen = append(seen, "pong")
			if len(seen) == 1 {
				return
			}
			// Shown the guide: does the close follow?
			ws.SetReadDeadline(time.Now().Add(5 * time.Second))
			continue
		case strings.Contains(string(b), id):
			seen = append(seen, "guide")
			continue
		default:
			continue
		}
		t.Fatalf("%s saw %s; want only the pong: not shown the close stage, not closed", what, strings.Join(seen, ","))
	}
}

// a1202eEnd reads ws until it ends, and returns its close code (-1: it
// ended without a close frame, 0: still open after patience), and
// whether a frame of guide id came before.
func a1202eEnd(ws *websocket.Conn, id string) (code int, guided bool) {
	ws.SetReadDeadline(time.Now().Add(patience))
	defer ws.SetReadDeadline(time.Time{})
	for {
		_, b, err := ws.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return ce.Code, guided
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return 0, guided
			}
			return -1, guided
		}
		if strings.Contains(string(b), id) {
			guided = true
		}
	}
}

// a1202eToldOnReconnect dials uid on tg again, as the device whose
// connection ended, pings, and wants c's frame before the pong: the
// device was there and silent when c's close was applied, and never
// written c.
func a1202eToldOnReconnect(t *testing.T, tg *testGateway, uid string, c push.Request, what string) {
	t.Helper()
	ws := tg.dial(t, uid)
	pingSaying(t, ws, -1)
	ws.SetReadDeadline(time.Now().Add(patience))
	defer ws.SetReadDeadline(time.Time{})
	var seen []string
	for {
		_, b, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("%s: read %v after %v; want c's frame, then the pong", what, err, seen)
		}
		switch {
		case strings.Contains(string(b), c.ID):
			return
		case strings.Contains(string(b), `"pong"`):
			t.Fatalf("%s: its reconnect saw %v, then the pong, and never c's frame; inbox now %v: the device, there and silent "+
				"when the chat closed, is never told", what, seen, tg.aaInboxIDs(t, uid))
		default:
			seen = append(seen, string(b))
		}
	}
}

// TestAttack1202eShedDuringRetriesNeverTold: the user has device S2 on
// instance P and device D on instance X, both silent. Close stage c is
// pushed on P: its close is applied, S2 is written c, closed 4000, and
// proves it (the entry kept ahead leaves the inbox, settled). X's
// decision of its routed copy fails, and X tries again while D is
// there (redeliverUndecided). Then X loses Redis altogether, for longer
// than STILLTHERE_SHED_AFTER: the shed closes D (1013: "the session
// survives; reconnect ... and ping"), and the loop, finding no
// connection, keeps c, which fails (Redis out of reach) or, once Redis
// is back, is refused as settled by S2's proof. D reconnects once Redis
// is back: it is handed nothing. D was there, silent, when the chat
// closed, and is never told (docs/protocol.md, "Sessions": "a connection
// they had open when the close was applied on the other device is handed
// it whatever they pinged since: that device was never told"). The
// change names the shed as what ends the loop in a long outage, and
// says the copy is then kept "as a routed copy that nobody here took
// is"; that keep is refused (the entry is settled), so the loop ends
// with the device's close stage dropped. Not only this change's: the
// six tries ended the same way.
//
// Known limit, not fixed: the settled mark is the user's (one device
// proved it: the user was told), and a reconnect carries no identity of
// the device it was. Kept for D's reconnect, c would be handed to any
// reconnect of the user, S2's included, which proved it already and was
// closed by it: told twice. The user was told on S2; D, ended by this
// instance (1013, 1001), comes back as a new connection.
func TestAttack1202eShedDuringRetriesNeverTold(t *testing.T) {
	t.Skip("known limit, not fixed: the settled mark is the user's, and a reconnect has no identity of the device it was; an entry kept for D's reconnect would be handed to S2's reconnect too, which proved c already (see the comment above)")
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	proxy, err := tcpproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	uid := "a1202e-shed-never-told"
	fail := &a1201dFailDecide{uid: uid}
	x := startGatewayHooked(t, []string{proxy.Addr()}, prefix, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.ShedAfter = time.Second
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
		t.Fatalf("push c on P: %+v, %v; want delivered to S2 here and X's subscriber", res, err)
	}
	readStage(t, ws2, c)
	readClose(t, ws2)
	waitUntil(t, "X's decision of c failed", func() bool { return fail.fails.Load() >= 1 })
	waitUntil(t, "c's entry kept ahead out of the inbox by S2's proof", func() bool { return len(p.aaInboxIDs(t, uid)) == 0 })

	// X loses Redis past its shed: D is closed to reconnect elsewhere.
	proxy.Cut()
	x.run.Tolerate()
	code, guided := a1202eEnd(wsD, c.ID)
	if guided || code == 0 || code == frame.CloseInactive {
		t.Fatalf("D ended %d (guided: %v); want the shed's end, not c: the test's premise fails", code, guided)
	}
	waitUntil(t, "D gone from X", func() bool { return len(x.hub.lookup(uid)) == 0 })
	proxy.Restore()
	fail.on.Store(false)
	waitUntil(t, "X reaches Redis again", func() bool { return x.rdb.Ping(context.Background()).Err() == nil })

	a1202eToldOnReconnect(t, p, uid, c, "D (shed by X during its retries of c)")
}

// TestAttack1202eShutdownDuringRetriesNeverTold: as the shed's, with X
// shut down (SIGTERM) while its retries of c wait for the decision: the
// drain closes D 1001 ("the session survives; reconnect"), and the loop,
// its context done, keeps c, which the inbox refuses as settled by S2's
// proof. D reconnects on P and is handed nothing: there and silent when
// the chat closed, it is never told. Not only this change's: a shutdown
// during the six tries ended the same way. Known limit, not fixed: see
// TestAttack1202eShedDuringRetriesNeverTold.
func TestAttack1202eShutdownDuringRetriesNeverTold(t *testing.T) {
	t.Skip("known limit, not fixed: the settled mark is the user's, and a reconnect has no identity of the device it was; an entry kept for D's reconnect would be handed to S2's reconnect too, which proved c already (see the comment above)")
	uid := "a1202e-shutdown-never-told"
	x, p, wsD, _, _, c, _ := a1202RetryPending(t, uid)
	x.stop(t)
	code, guided := a1202eEnd(wsD, c.ID)
	if guided || code != websocket.CloseGoingAway {
		t.Fatalf("D ended %d (guided: %v); want the drain's 1001, not c: the test's premise fails", code, guided)
	}
	a1202eToldOnReconnect(t, p, uid, c, "D (drained by X during its retries of c)")
}
