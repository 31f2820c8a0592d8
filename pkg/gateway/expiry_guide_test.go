package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
)

// TestGuideToExpiringConnectionNotLost: a guide pushed while the gateway
// is closing a connection for its expired token (4001 sent, the client's
// close not yet back: one round trip, up to the linger second) must not be
// answered "delivered" to a socket that will never carry it. Nothing is
// written after a close frame, so it has to go to the inbox and reach the
// user's next connection. Promise broken otherwise: a guide lost, recorded
// as delivered for a day, so no retry brings it back.
func TestGuideToExpiringConnectionNotLost(t *testing.T) {
	tg := startGateway(t, nil)
	end := time.Now().Add(time.Second).Truncate(time.Second).Add(time.Second)
	ws := dialToken(t, tg, signToken(t, "erin", "", end))
	// A client slow to answer the close (a mobile network): it does not
	// echo it, so the gateway lingers for it.
	ws.SetCloseHandler(func(int, string) error { return nil })
	if code, _ := readUntilClose(t, ws, 5*time.Second); code != frame.CloseTokenExpired {
		t.Fatalf("close %d, want %d", code, frame.CloseTokenExpired)
	}

	req := push.Request{ID: "0123456789abcdef0123456789abcdef", UID: "erin", Text: "Still there?", DeadlineMS: redisNowMS(t, tg.rdb)}
	res, err := tg.pushGuide(t, req)
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	if res.Status == push.Delivered {
		t.Errorf("push answered %s to %d connection(s), but the only one had been sent its 4001 close", res.Status, res.Connections)
	}

	// Whatever the answer, the user's next connection must get the guide.
	ws2 := dialToken(t, tg, signToken(t, "erin", "", time.Now().Add(time.Hour)))
	ws2.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, b, err := ws2.ReadMessage()
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the reconnected user got no guide: it was lost")
	}
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if f, _ := frame.Parse(b); f.Type != frame.TypeGuide {
		t.Fatalf("got %s, want the guide", b)
	}
}

// TestCloseReplyTo4001KeepsSession: a client that answers the gateway's
// 4001 with a close of its own code 1000 (RFC 6455 only says an endpoint
// "typically" echoes the code; OkHttp apps, for one, call close(1000) from
// onClosing) has not left on purpose: the gateway ended the connection.
// docs/protocol.md: "A connection closed with 4001 is like any other
// abnormal end: the session runs out". Promise broken otherwise: a silent
// user whose token expired has their session deleted as a deliberate
// leave, and never gets the guide.
func TestCloseReplyTo4001KeepsSession(t *testing.T) {
	tg := startGateway(t, nil)
	end := time.Now().Add(time.Second).Truncate(time.Second).Add(time.Second)
	ws := dialToken(t, tg, signToken(t, "olga", "", end))
	pingPong(t, ws) // a session of 10-11s, well past the token's end
	route := tg.store.Keyspace().RouteKey("olga")
	inRoute := func() bool { return tg.rdb.HExists(context.Background(), route, tg.instance).Val() }
	waitUntil(t, "the connection in olga's route", inRoute)
	ws.SetCloseHandler(func(code int, _ string) error {
		// The reply a client library sends when the app closes normally.
		return ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	})
	if code, _ := readUntilClose(t, ws, 5*time.Second); code != frame.CloseTokenExpired {
		t.Fatalf("close %d, want %d", code, frame.CloseTokenExpired)
	}
	// The route write that takes the connection out of the route is the
	// one that ends the session after a close taken for a leave: once it
	// is done, so is the decision.
	waitUntil(t, "the closed connection out of olga's route", func() bool { return !inRoute() })
	key := tg.store.Keyspace().SessionKey("olga")
	if n, err := tg.rdb.Exists(context.Background(), key).Result(); err != nil {
		t.Fatal(err)
	} else if n == 0 {
		t.Fatal("session deleted: the client's close reply to 4001 was taken for the user leaving on purpose")
	}
}
