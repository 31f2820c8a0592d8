package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
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
	if _, err := tg.renewer.Renew(ctx, "someone-else", session.DefaultSegment, time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	if sessionExists(tg, uid) {
		pttl := tg.rdb.PTTL(ctx, ks.SessionKey(uid)).Val()
		t.Fatalf("the user closed with 1000 and left, but their session runs on (%v left): its silence will be guided", pttl)
	}
}

// TestRedisStallDoesNotStallReads: while Redis hangs (SIGSTOP), the
// renewals of many users' pings wait on it, but nothing a connection is
// read with waits for them: in epoll mode the workers are shared by every
// connection, and one that waited in a ping would hold up every other
// user's frames. Another user's frame is answered at once, and the pings
// are all answered, with unavailable, once their round trips give up.
func TestRedisStallDoesNotStallReads(t *testing.T) {
	srv := redistest.Start(t)
	tg := startGatewayOn(t, []string{srv.Addr}, redistest.Prefix(t), nil)
	const stalled = 32 // more than the epoll workers
	pingers := make([]*websocket.Conn, stalled)
	for i := range pingers {
		pingers[i] = tg.dial(t, fmt.Sprintf("stalled-%d", i))
	}
	other := tg.dial(t, "other")
	pingPong(t, other)

	srv.Pause()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			srv.Resume()
		}
	}
	t.Cleanup(resume)
	for _, ws := range pingers {
		if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	other.WriteMessage(websocket.TextMessage, []byte(`{"type":"nonsense"}`))
	if m := readJSON(t, other); m["type"] != "error" || m["code"] != "unknown_type" {
		t.Fatalf("got %v, want an unknown_type error", m)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("another user's frame was answered after %v while Redis hung", took)
	}
	for i, ws := range pingers {
		ws.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, b, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("pinger %d: %v", i, err)
		}
		var m map[string]any
		json.Unmarshal(b, &m)
		if m["type"] != "error" || m["code"] != "unavailable" {
			t.Fatalf("pinger %d got %v while Redis hung, want unavailable", i, m)
		}
	}
	resume()
	for _, ws := range pingers[:2] {
		waitUntil(t, "a ping renews again", func() bool {
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
			return readJSON(t, ws)["type"] == "pong"
		})
	}
}

// TestSlowClientCutOnce: a client that stops reading is cut off once its
// send queue is full, and its end is counted once: its slot among the
// gateway's connections comes back (a second release would count it out
// twice, a missing one never), and a connection of another user that
// reads on is untouched.
func TestSlowClientCutOnce(t *testing.T) {
	tg := startGateway(t, nil)
	reader := tg.dial(t, "reads")
	_ = tg.dial(t, "slow") // never read
	slow := tg.hub.lookup("slow")[0]
	if n := tg.open.Load(); n != 2 {
		t.Fatalf("%d connections open, want 2", n)
	}
	big := []byte(`{"type":"x","pad":"` + strings.Repeat("p", 64<<10) + `"}`)
	// Each frame waits behind the one being written once the socket's
	// buffers are full; then the queue fills, and the client is cut off.
	waitUntil(t, "the slow client cut off", func() bool {
		slow.enqueue(big)
		return slow.is(flagClosed)
	})
	waitUntil(t, "the slow client released", func() bool { return tg.hub.count("slow") == 0 && tg.open.Load() == 1 })
	pingPong(t, reader)
	// Whatever is still on its way (Closed's goroutine) has ended.
	waitUntil(t, "the gateway's connection goroutines settled", func() bool { return tg.open.Load() == 1 })
	tg.stop(t)
	if n := tg.open.Load(); n != 0 {
		t.Fatalf("%d connections counted open after the drain, want 0", n)
	}
}

// TestRefusedFrameCloseCodes: a frame the gateway refuses closes the
// connection with the code that says why, and the client reads it: the
// reader lingers after it (gorilla's 1009 for an oversize frame, the
// flusher's close frame for the rest), instead of closing a socket with
// the client's input unread, which would reset the connection and lose
// the close.
func TestRefusedFrameCloseCodes(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.RateBurst, c.RatePerSecond = 5, 1 })
	for _, tc := range []struct {
		name   string
		frames func(ws *websocket.Conn)
		code   int
	}{
		{"oversize", func(ws *websocket.Conn) {
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping","pad":"`+strings.Repeat("p", tg.cfg.ReadLimit)+`"}`))
		}, websocket.CloseMessageTooBig},
		{"flood", func(ws *websocket.Conn) {
			for range 20 {
				ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ack","id":"x"}`))
			}
		}, websocket.ClosePolicyViolation},
		{"binary", func(ws *websocket.Conn) { ws.WriteMessage(websocket.BinaryMessage, []byte{1}) }, websocket.CloseUnsupportedData},
		{"not json", func(ws *websocket.Conn) { ws.WriteMessage(websocket.TextMessage, []byte(`nope`)) }, websocket.CloseInvalidFramePayloadData},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := "refused-" + strings.ReplaceAll(tc.name, " ", "-")
			ws := tg.dial(t, uid)
			tc.frames(ws)
			ws.SetReadDeadline(time.Now().Add(10 * time.Second))
			for {
				_, _, err := ws.ReadMessage()
				if err == nil {
					continue
				}
				if !websocket.IsCloseError(err, tc.code) {
					t.Fatalf("read %v, want a close with %d", err, tc.code)
				}
				break
			}
			ws.Close()
			waitUntil(t, "the connection released", func() bool { return tg.hub.count(uid) == 0 })
		})
	}
}
