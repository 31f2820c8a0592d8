package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestPingThenLeave: a client pings and closes with 1000 right after,
// before the ping's renewal is written (renewals are written after
// Message returns, from the renewer). The user left on purpose: once
// the close and the renewal have both landed, no session is left to run
// out and be guided, whichever of them Redis ran first.
func TestPingThenLeave(t *testing.T) {
	// held: the client asked to ping first (first=ping), so its first
	// ping is answered once its hold ends, on a goroutine of its own.
	for _, held := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "held"}[held], func(t *testing.T) { testPingThenLeave(t, held) })
	}
}

func testPingThenLeave(t *testing.T, held bool) {
	tg := startGateway(t, func(c *Config) {
		// A renewal waits this long for others to share its round trip:
		// the close is read, and released, meanwhile.
		c.RenewFlushInterval = 300 * time.Millisecond
	})
	ctx := context.Background()
	const uid = "leaver"
	ks := tg.store.Keyspace()
	var ws *websocket.Conn
	if held {
		ws = tg.dialFirstPing(t, uid)
	} else {
		ws = tg.dial(t, uid)
		pingPong(t, ws) // the session exists
	}
	waitUntil(t, "the route written", func() bool { return tg.rdb.Exists(ctx, ks.RouteKey(uid)).Val() == 1 })

	ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
	closeNormally(ws)
	waitUntil(t, "the connection released", func() bool {
		return tg.hub.count(uid) == 0 && tg.rdb.Exists(ctx, ks.RouteKey(uid)).Val() == 0
	})
	// The renewer settles in the order asked: once this one is written,
	// so is the ping's.
	if _, err := tg.renewer.Renew(ctx, "someone-else", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if sessionExists(tg, uid) {
		pttl := tg.rdb.PTTL(ctx, ks.SessionKey(uid)).Val()
		t.Fatalf("the user closed with 1000 and left, but their session runs on (%v left): its silence will be guided", pttl)
	}
}
