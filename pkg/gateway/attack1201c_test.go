package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorilla/websocket"

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
