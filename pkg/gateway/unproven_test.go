package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
	"github.com/stillthere/stillthere/pkg/token"
)

// dialThrough connects uid to the gateway through a TCP proxy of its own,
// which the test can make a half-open connection of.
func (tg *testGateway) dialThrough(t *testing.T, uid string) (*websocket.Conn, *tcpproxy.Proxy) {
	t.Helper()
	p, err := tcpproxy.Start(tg.PublicAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	tok, err := token.Mint([]byte(tokenSecret), uid, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+p.Addr()+"/v1/ws", http.Header{"Authorization": {"Bearer " + tok}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws, p
}

// TestGuideToHalfOpenConnectionNotLost: the phone loses its network
// without a FIN, so the gateway's writes to its connection still succeed
// (into the kernel and a network that drops them), and a guide pushed then
// is answered delivered. Nothing proves the client got it, neither an ack
// nor a pong to a ping sent after it, so the guide is not lost with the
// connection: the user who reconnects is shown it, on a connection made
// while the old one still looked open, or after it ended. A client that
// proves it got a guide, acking or not, is not shown it again; one who came
// back and pinged meanwhile is not shown it at all.
func TestGuideToHalfOpenConnectionNotLost(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.WriteTimeout = 2 * time.Second // the longest a guide waits for its proof
		c.IdleTimeout = time.Hour        // so only a guide's missing proof ends the old connection
	})
	ctx := context.Background()
	ks := tg.store.Keyspace()
	halfOpen := func(t *testing.T, uid string) {
		t.Helper()
		ws, p := tg.dialThrough(t, uid)
		pingPong(t, ws)
		p.Blackhole() // the network drops every byte; nobody sends a FIN
	}
	guide := func(t *testing.T, uid, id string) push.Request {
		t.Helper()
		req := push.Request{ID: id, UID: uid, Text: "Are you still there?", DeadlineMS: redisNowMS(t, tg.rdb)}
		if res := tg.mustPush(t, req, push.Delivered); res.Connections != 1 {
			t.Fatalf("delivered to %d connections, want 1", res.Connections)
		}
		return req
	}

	t.Run("reconnect while the old connection looks open", func(t *testing.T) {
		halfOpen(t, "hana")
		req := guide(t, "hana", "h1")
		ws := tg.dial(t, "hana")
		readGuide(t, ws, req.ID)
		pingPong(t, ws) // and only once
	})

	t.Run("reconnect after it ended", func(t *testing.T) {
		halfOpen(t, "ivo")
		req := guide(t, "ivo", "i1")
		waitUntil(t, "the unproven connection ends", func() bool { return tg.hub.count("ivo") == 0 })
		ws := tg.dial(t, "ivo")
		readGuide(t, ws, req.ID)
		pingPong(t, ws)
		waitUntil(t, "the guide leaves the inbox", func() bool { return tg.rdb.LLen(ctx, ks.InboxKey("ivo")).Val() == 0 })
	})

	t.Run("proven by a pong, not shown again", func(t *testing.T) {
		ws := tg.dial(t, "jon")
		pingPong(t, ws)
		req := guide(t, "jon", "j1")
		readGuide(t, ws, req.ID)
		pingPong(t, ws) // reading answers the gateway's ping: proof, without an ack
		// Kept ahead of its delivery, it leaves the inbox once proven.
		waitUntil(t, "the proven guide leaves the inbox", func() bool { return tg.rdb.LLen(ctx, ks.InboxKey("jon")).Val() == 0 })
		ws.Close() // dropped, no close frame
		waitUntil(t, "the connection ends", func() bool { return tg.hub.count("jon") == 0 })
		ws = tg.dial(t, "jon")
		pingPong(t, ws) // the first frame is the pong: no guide handed over
		if n := tg.rdb.LLen(ctx, ks.InboxKey("jon")).Val(); n != 0 {
			t.Fatalf("inbox holds %d guides of a client that got its guide", n)
		}
	})

	t.Run("another device that got it is not sent it again", func(t *testing.T) {
		laptop := tg.dial(t, "lia")
		pingPong(t, laptop)
		halfOpen(t, "lia")
		// The laptop reads on, which answers the gateway's pings, and
		// does not ping: a ping after the deadline would make the
		// phone's copy stale.
		frames := make(chan map[string]any, 8)
		go func() {
			defer close(frames)
			for {
				var m map[string]any
				if err := laptop.ReadJSON(&m); err != nil {
					return
				}
				frames <- m
			}
		}()
		next := func() map[string]any {
			t.Helper()
			select {
			case m := <-frames:
				return m
			case <-time.After(10 * time.Second):
				t.Fatal("no frame within 10s")
				return nil
			}
		}
		req := push.Request{ID: "l1", UID: "lia", Text: "Are you still there?", DeadlineMS: redisNowMS(t, tg.rdb)}
		handedOn := counterValue(t, metricPushes.WithLabelValues("handed_on"))
		if res := tg.mustPush(t, req, push.Delivered); res.Connections != 2 {
			t.Fatalf("delivered to %d connections, want 2", res.Connections)
		}
		if m := next(); m["type"] != "guide" || m["id"] != req.ID {
			t.Fatalf("laptop got %v, want guide %s", m, req.ID)
		}
		waitUntil(t, "the phone's guide is handed on", func() bool {
			return counterValue(t, metricPushes.WithLabelValues("handed_on")) > handedOn
		})
		laptop.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
		if m := next(); m["type"] != "pong" {
			t.Fatalf("laptop got %v, want the pong: it had the guide already", m)
		}
		// Kept ahead of its delivery, and again as it was handed on: the
		// laptop's proof takes it out of the inbox.
		waitUntil(t, "the inbox of a user whose laptop got it empties", func() bool {
			return tg.rdb.LLen(ctx, ks.InboxKey("lia")).Val() == 0
		})
	})

	t.Run("the user came back meanwhile", func(t *testing.T) {
		halfOpen(t, "kai")
		guide(t, "kai", "k1")
		// The inbox holds the guide, kept ahead of its delivery, while
		// the old connection waits for its proof; the client's first
		// ping says the user is active now: they are back, and its
		// renewal after the deadline makes the old connection's copy
		// stale too.
		ws := tg.dialFirstPing(t, "kai")
		pingSaying(t, ws, 0)
		readPong(t, ws)
		waitUntil(t, "the unproven connection ends", func() bool { return tg.hub.count("kai") == 1 })
		pingPong(t, ws) // the next frame is the pong: no guide
		waitUntil(t, "the inbox of a user who came back empties", func() bool {
			return tg.rdb.LLen(ctx, ks.InboxKey("kai")).Val() == 0
		})
		// Their timeline says why the guide went no further.
		if e := tg.waitEntry(t, "kai", "skipped:came-back", "k1"); !strings.Contains(e.Detail, "not handed on") {
			t.Errorf("came back: %+v, want it said that it was not handed on", e)
		}
	})
}
