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

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on closes applied whatever the user did (Store.ApplyClose): a
// close stage pushed without deadline_ms, which a connection used to
// write with no Redis call (nothing can cancel it), is now decided in
// Redis first, and a failed call means "not written now, kept for later".

// a1201cUndated is stage of uid's silence as pushed without deadline_ms.
func a1201cUndated(uid string, stage int, action string) push.Request {
	req := stagePush(uid, 0, stage, action)
	req.ID = uid + "-stage-" + action
	return req
}

// a1201cWantClosed reads ws's next frame and wants the close 4000
// "inactive": what a close stage's frame promises right after it.
func a1201cWantClosed(t *testing.T, ws *websocket.Conn, what string) {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(patience))
	defer ws.SetReadDeadline(time.Time{})
	_, b, err := ws.ReadMessage()
	var ce *websocket.CloseError
	switch {
	case errors.As(err, &ce) && ce.Code == frame.CloseInactive:
	case errors.As(err, &ce):
		t.Fatalf("%s was closed %d %q; want %d inactive", what, ce.Code, ce.Text, frame.CloseInactive)
	case err != nil:
		t.Fatalf("%s was shown the close stage's frame and left open (read: %v); want the close %d right after it", what, err, frame.CloseInactive)
	default:
		t.Fatalf("%s got %s after the close stage's frame; want the close %d", what, b, frame.CloseInactive)
	}
}

// TestAttack1201cUndatedCloseRedisBlipNeverClosed: device D is connected
// on instance X, silent. Close stage c, pushed without deadline_ms (the
// push contract makes it optional), is pushed on instance P: P keeps it
// ahead in the inbox and routes it to X. X reads the routed copy during
// a brief loss of its Redis link. Before ApplyClose, D was written c and
// closed 4000 with no Redis call: nothing can cancel a close without a
// deadline. Now commitClose's ApplyClose fails, D refuses c, and X's keep
// of it fails too (the entry kept ahead by P stays). Redis comes back,
// and X's route refresh offers D the inbox: D is shown c, whose close
// the offer applies while D is open and silent, and no live copy follows
// to close it. D is told the chat is closed, but is left open and its
// session alive: the close stage's "writes that frame, then closes the
// connection with 4000 and ends the session" is broken for a device that
// was there, silent, throughout.
func TestAttack1201cUndatedCloseRedisBlipNeverClosed(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	proxy, err := tcpproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	x := startGatewayOn(t, []string{proxy.Addr()}, prefix, func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour // only the test offers the inbox, as the refresh would
	})
	p := startGatewayOn(t, []string{srv.Addr}, prefix, nil)
	uid := "a1201c-undated-blip"

	wsD := x.dial(t, uid) // there, silent
	aofServed(t, wsD)
	c := a1201cUndated(uid, 2, timeoutevent.ActionClose)
	p.aofKeepAhead(t, c) // P's route: kept ahead, then routed to X

	// X reads the routed copy while its Redis link is down.
	proxy.Cut()
	x.run.Tolerate()
	x.readRouted(t, c)
	proxy.Restore()
	waitUntil(t, "X reaches Redis again", func() bool { return x.rdb.Ping(ctx).Err() == nil })

	// X's route refresh offers the inbox to its connections.
	x.offerInbox(ctx, uid)
	readStage(t, wsD, c) // the live copy (before ApplyClose), or the offer's
	aaAck(t, wsD, c.ID)
	a1201cWantClosed(t, wsD, "D, connected and silent when the close stage without deadline_ms came,")
	waitUntil(t, "D ends, and its 4000 ends the session", func() bool {
		return x.hub.count(uid) == 0 && !sessionExists(p, uid)
	})
}

// a1201cFailCloseCommit fails the nth run of close_commit.lua for uid's
// closes on the client it hooks, as a connection reset would: a brief
// Redis failure that hits one call and no other.
type a1201cFailCloseCommit struct {
	uid   string
	nth   int32
	calls atomic.Int32
}

func (h *a1201cFailCloseCommit) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *a1201cFailCloseCommit) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *a1201cFailCloseCommit) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			for _, a := range cmd.Args() {
				// CloseAtKey: only close_commit.lua names it.
				if s, ok := a.(string); ok && strings.Contains(s, "pca:"+h.uid+"/") {
					if h.calls.Add(1) == h.nth {
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

// TestAttack1201cUndatedCloseBlipLosesSecondDevice: the user has two
// devices D1 and D2 on this instance, both silent. Close stage c is
// pushed without deadline_ms. The push keeps it ahead and hands it to
// both connections, whose delivery decides its close once (commitClose,
// ApplyClose for a close without a deadline), and Redis fails that call
// for a moment. Refused, c was kept in the inbox, where an offer shows it
// to one device, which nothing closes then, and the other is never
// shown it; when each connection decided alone, the one whose call
// failed refused c while the other took it, and was never told. Nothing
// cancels a close without a deadline: it is written to both all the
// same, and both are closed.
func TestAttack1201cUndatedCloseBlipLosesSecondDevice(t *testing.T) {
	uid := "a1201c-undated-two"
	fail := &a1201cFailCloseCommit{uid: uid, nth: 1}
	tg, ws1, ws2 := a1201cTwoSilent(t, uid, fail)

	c := a1201cUndated(uid, 2, timeoutevent.ActionClose)
	res, err := tg.pushGuide(t, c)
	if err != nil || res.Status != push.Delivered {
		t.Fatalf("push c: %+v, %v; want delivered", res, err)
	}
	a1201cEachToldAndClosed(t, tg, uid, c, ws1, ws2)
}

// a1201cEachToldAndClosed wants close stage c's frame, then the close
// 4000, on each of the user's silent devices, and then the session ended.
func a1201cEachToldAndClosed(t *testing.T, tg *testGateway, uid string, c push.Request, wss ...*websocket.Conn) {
	t.Helper()
	got := make(chan string, len(wss))
	for i, ws := range wss {
		name := "D" + strconv.Itoa(i+1)
		go func() {
			ws.SetReadDeadline(time.Now().Add(patience))
			var frames []string
			for {
				_, b, err := ws.ReadMessage()
				var ce *websocket.CloseError
				if errors.As(err, &ce) {
					frames = append(frames, "close:"+strconv.Itoa(ce.Code))
					break
				}
				if err != nil {
					frames = append(frames, "open")
					break
				}
				if strings.Contains(string(b), c.ID) {
					frames = append(frames, "guide")
				}
			}
			got <- name + " " + strings.Join(frames, ",")
		}()
	}
	var seen []string
	for range wss {
		seen = append(seen, <-got)
	}
	for _, s := range seen {
		if !strings.HasSuffix(s, " guide,close:4000") {
			t.Errorf("%s; want the close stage's frame, then the close 4000, on each silent device (all: %v; inbox now %v)", s, seen, tg.aaInboxIDs(t, uid))
		}
	}
	if t.Failed() {
		return
	}
	waitUntil(t, "the session ended by the close", func() bool { return tg.hub.count(uid) == 0 && !sessionExists(tg, uid) })
}

// TestCloseDecidedOncePerDelivery: two silent devices of the user on this
// instance, and a close stage c with a deadline pushed to them; Redis
// fails a second decision of its close for a moment. Each connection used
// to decide on its own: the first applied and took c, the second's call
// failed and it refused c, while the push answered delivered; the first's
// proof then took c's entry kept ahead out of the inbox, and the second
// device was never told nor closed, its session living on. The delivery
// now decides once for all of its connections: both are told and closed.
func TestCloseDecidedOncePerDelivery(t *testing.T) {
	uid := "close-once"
	// The push's own look at the close (closeOver) is the first call; the
	// first connection's decision the second.
	fail := &a1201cFailCloseCommit{uid: uid, nth: 3}
	tg, ws1, ws2 := a1201cTwoSilent(t, uid, fail)
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	if res, err := tg.pushGuide(t, c); err != nil || res.Status != push.Delivered || res.Connections != 2 {
		t.Fatalf("push c: %+v, %v; want delivered to 2 connections", res, err)
	}
	a1201cEachToldAndClosed(t, tg, uid, c, ws1, ws2)
}

// TestCloseUndecidedPushedAgain: two silent devices of the user on this
// instance, and close stage c with a deadline pushed to them; Redis fails
// the delivery's decision of its close for a moment. Neither takes c.
// Kept in the inbox (queued), it was offered to one of them as the
// inbox's copy, which closes nothing: that device was shown the close and
// left open, and the other never shown it once the first proved it. The
// push now fails, and the consumer's next push decides the close and
// closes both.
func TestCloseUndecidedPushedAgain(t *testing.T) {
	uid := "close-undecided"
	// The push's own look at the close (closeOver) is the first call; the
	// delivery's decision the second.
	fail := &a1201cFailCloseCommit{uid: uid, nth: 2}
	tg, ws1, ws2 := a1201cTwoSilent(t, uid, fail)
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	if res, err := tg.pushGuide(t, c); err == nil {
		t.Fatalf("push c with its close undecided: %+v; want an error, for the consumer to push it again (inbox %v)", res, tg.aaInboxIDs(t, uid))
	}
	if res, err := tg.pushGuide(t, c); err != nil || res.Status != push.Delivered || res.Connections != 2 {
		t.Fatalf("push c again: %+v, %v; want delivered to 2 connections", res, err)
	}
	a1201cEachToldAndClosed(t, tg, uid, c, ws1, ws2)
}

// a1201cTwoSilent starts a gateway whose Redis client runs fail, and
// connects two silent devices of uid to it, each served.
func a1201cTwoSilent(t *testing.T, uid string, fail redis.Hook) (tg *testGateway, ws1, ws2 *websocket.Conn) {
	t.Helper()
	tg = startGatewayHooked(t, []string{redistest.Start(t).Addr}, redistest.Prefix(t),
		slog.New(slog.NewTextHandler(io.Discard, nil)), func(c *Config) {
			c.WriteTimeout = 30 * time.Second
		}, func(g *Gateway) { g.rdb.AddHook(fail) })
	ws1 = tg.dial(t, uid)
	aofServed(t, ws1)
	ws2 = tg.dial(t, uid)
	aofServed(t, ws2)
	return tg, ws1, ws2
}
