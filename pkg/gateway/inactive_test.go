package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

const closeText = "We haven't heard from you, so we closed this chat."

// counterValue reads a counter.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// stagePush is the push of stage of uid's silence that ran out at
// deadlineMS, as the consumer sends it.
func stagePush(uid string, deadlineMS int64, stage int, action string) push.Request {
	text := "Are you still there?"
	if action == timeoutevent.ActionClose {
		text = closeText
	}
	return push.Request{ID: timeoutevent.StageID(uid, deadlineMS, stage), UID: uid, Text: text, DeadlineMS: deadlineMS,
		Stage: stage, Action: action, Final: action == timeoutevent.ActionClose}
}

// readStage reads the next frame and wants it to be req's guide.
func readStage(t *testing.T, ws *websocket.Conn, req push.Request) {
	t.Helper()
	m := readGuide(t, ws, req.ID)
	if m["stage"] != float64(req.Stage) || m["final"] != req.Final || m["text"] != req.Text {
		t.Fatalf("guide frame %v, want stage %d, final %v, text %q", m, req.Stage, req.Final, req.Text)
	}
}

// readClose reads until the connection closes, and wants it closed with
// 4000 "inactive" with no frame before.
func readClose(t *testing.T, ws *websocket.Conn) {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, b, err := ws.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		t.Fatalf("read %s, %v; want the close 4000", b, err)
	}
	if ce.Code != frame.CloseInactive || ce.Text != "inactive" {
		t.Fatalf("closed %d %q, want %d %q", ce.Code, ce.Text, frame.CloseInactive, "inactive")
	}
}

// sessionDeadline is uid's deadline in the index, Unix ms.
func sessionDeadline(t *testing.T, tg *testGateway, uid string) int64 {
	t.Helper()
	ks := tg.store.Keyspace()
	d, err := tg.rdb.ZScore(context.Background(), ks.IndexKey(session.Bucket(uid)), uid).Result()
	if err != nil {
		t.Fatalf("%s's deadline: %v", uid, err)
	}
	return int64(d)
}

// TestCloseStageClosesConnection: a silent user is reminded, then gets
// the close stage's guide, marked final, and the connection closes with
// 4000 "inactive". The session and the route are gone, as after the
// user's own normal close, so no later stage of that silence follows and
// a resync restores nothing; a new silence's guide waits in the inbox.
func TestCloseStageClosesConnection(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.SessionTTL, c.SessionJitter = time.Second, 0 })
	ctx := context.Background()
	ks := tg.store.Keyspace()
	closed0 := counterValue(t, metricClosedInactive)
	ws := tg.dial(t, "cleo")
	pingPong(t, ws)
	deadline := sessionDeadline(t, tg, "cleo")
	waitUntil(t, "the session to run out", func() bool { return !sessionExists(tg, "cleo") })

	remind := stagePush("cleo", deadline, 1, timeoutevent.ActionRemind)
	tg.mustPush(t, remind, push.Delivered)
	readStage(t, ws, remind)
	if d := counterValue(t, metricClosedInactive) - closed0; d != 0 {
		t.Fatalf("a reminder counted %v users closed", d)
	}

	closing := stagePush("cleo", deadline, 2, timeoutevent.ActionClose)
	if res := tg.mustPush(t, closing, push.Delivered); res.Connections != 1 {
		t.Fatalf("close stage delivered to %d connections, want 1", res.Connections)
	}
	readStage(t, ws, closing)
	readClose(t, ws)
	waitUntil(t, "the route to end", func() bool {
		return tg.rdb.Exists(ctx, ks.RouteKey("cleo")).Val() == 0 && tg.hub.count("cleo") == 0
	})
	if _, err := tg.rdb.ZScore(ctx, ks.IndexKey(session.Bucket("cleo")), "cleo").Result(); err == nil {
		t.Error("the session is still in the deadline index")
	}
	// Counted by the route write that ends the session, once it returns.
	waitUntil(t, "one more user closed for inactivity", func() bool {
		return counterValue(t, metricClosedInactive)-closed0 == 1
	})
	tg.dropped.mu.Lock()
	_, kept := tg.dropped.grants["cleo"]
	tg.dropped.mu.Unlock()
	if kept {
		t.Error("the closed connection's grant is kept for a resync, as after a dropped connection")
	}

	// Nothing of that silence follows: it ended after its deadline.
	tg.mustPush(t, stagePush("cleo", deadline, 3, timeoutevent.ActionRemind), push.Stale)
	tg.mustPush(t, closing, push.Duplicate)
	// A later silence's guide is kept for the next connect.
	later := stagePush("cleo", redisNowMS(t, tg.rdb)+1, 1, timeoutevent.ActionRemind)
	tg.mustPush(t, later, push.Queued)
	ws = tg.dial(t, "cleo")
	readStage(t, ws, later)
	pingPong(t, ws)
}

// TestCloseStageOnTwoDevices: a user on two devices, on one gateway
// instance or two, gets the close stage's guide and the close on both,
// and the session ends with the second.
func TestCloseStageOnTwoDevices(t *testing.T) {
	addrs := []string{redistest.Start(t).Addr}
	prefix := redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	for _, tt := range []struct {
		name        string
		uid         string
		laptopOn    *testGateway
		phoneOn     *testGateway
		connections int
	}{
		{"on one instance", "dora", a, a, 2},
		{"on two instances", "emil", a, b, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			closed0 := counterValue(t, metricClosedInactive)
			laptop := tt.laptopOn.dial(t, tt.uid)
			phone := tt.phoneOn.dial(t, tt.uid)
			pingPong(t, laptop)
			pingPong(t, phone)
			closing := stagePush(tt.uid, sessionDeadline(t, a, tt.uid), 2, timeoutevent.ActionClose)
			if res := a.mustPush(t, closing, push.Delivered); res.Connections != tt.connections {
				t.Fatalf("delivered to %d connections, want %d", res.Connections, tt.connections)
			}
			for _, ws := range []*websocket.Conn{laptop, phone} {
				readStage(t, ws, closing)
				readClose(t, ws)
			}
			waitUntil(t, "the session and the route end", func() bool {
				return !sessionExists(a, tt.uid) && a.rdb.Exists(ctx, a.store.Keyspace().RouteKey(tt.uid)).Val() == 0
			})
			waitUntil(t, "one more user closed for inactivity", func() bool {
				return counterValue(t, metricClosedInactive)-closed0 >= 1
			})
			if d := counterValue(t, metricClosedInactive) - closed0; d != 1 {
				t.Errorf("users closed for inactivity: %v more, want 1 (one user)", d)
			}
		})
	}
}

// TestCloseStageFromInbox: a close stage's guide kept for a user with no
// connection is handed over on their next connect, and that connection
// stays open: the user is back. A later stage's max age in the inbox
// counts from when it was kept, not from the deadline its delays put
// back.
func TestCloseStageFromInbox(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.GuideMaxAge = 2 * time.Second })
	closed0 := counterValue(t, metricClosedInactive)
	closing := stagePush("fay", redisNowMS(t, tg.rdb)-3000, 2, timeoutevent.ActionClose)
	tg.mustPush(t, closing, push.Queued)

	ws := tg.dial(t, "fay")
	readStage(t, ws, closing)
	pingPong(t, ws)
	// Real time must pass: a close stage's close ends the connection when
	// its linger, a read deadline on the socket, runs out; it would have
	// by now.
	time.Sleep(lingerTimeout + 100*time.Millisecond)
	pingPong(t, ws)
	if !sessionExists(tg, "fay") {
		t.Fatal("the user who came back has no session")
	}
	waitUntil(t, "the guide leaves the inbox", func() bool {
		return tg.rdb.LLen(context.Background(), tg.store.Keyspace().InboxKey("fay")).Val() == 0
	})
	if d := counterValue(t, metricClosedInactive) - closed0; d != 0 {
		t.Errorf("a close stage from the inbox counted %v users closed", d)
	}
}

// TestCloseStageGuideHandedOn: a close stage's guide that a half-open
// connection never proved reaches the user on their next connection,
// and closes nothing there: the user is back. It does so also when they
// reconnected before the old connection ended (their connect found the
// inbox empty), and when their client's first ping says they were active
// meanwhile: the chat was closed all the same.
func TestCloseStageGuideHandedOn(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.WriteTimeout = 2 * time.Second // the longest a guide waits for its proof
		c.IdleTimeout = time.Hour        // only a missing proof, or the close, ends the old connection
	})
	ctx := context.Background()
	ks := tg.store.Keyspace()
	closeHalfOpen := func(t *testing.T, uid string) push.Request {
		t.Helper()
		ws, p := tg.dialThrough(t, uid)
		pingPong(t, ws)
		p.Blackhole() // the network drops every byte; nobody sends a FIN
		req := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
		tg.mustPush(t, req, push.Delivered)
		return req
	}
	stillOpen := func(t *testing.T, ws *websocket.Conn, uid string) {
		t.Helper()
		pingPong(t, ws) // no 4000, and the ping renews
		if !sessionExists(tg, uid) {
			t.Fatal("the user who came back has no session")
		}
		waitUntil(t, "the guide leaves the inbox", func() bool { return tg.rdb.LLen(ctx, ks.InboxKey(uid)).Val() == 0 })
	}

	t.Run("reconnect while the old connection looks open", func(t *testing.T) {
		req := closeHalfOpen(t, "nils")
		ws := tg.dial(t, "nils")
		readStage(t, ws, req) // once the old connection ends unproven
		stillOpen(t, ws, "nils")
	})
	t.Run("a first ping saying the user was active", func(t *testing.T) {
		req := closeHalfOpen(t, "olga")
		waitUntil(t, "the half-open connection ends", func() bool { return tg.hub.count("olga") == 0 })
		waitUntil(t, "the guide is kept", func() bool { return tg.rdb.LLen(ctx, ks.InboxKey("olga")).Val() == 1 })
		ws := tg.dialFirstPing(t, "olga")
		pingSaying(t, ws, 200)
		readStage(t, ws, req)
		readPong(t, ws)
		stillOpen(t, ws, "olga")
	})
}

// TestCloseStageProvenDuringLinger: a client that sends a frame after the
// close stage's guide, before it answers the ping that follows the guide,
// still proves it got it: the gateway reads on after that frame for the
// pong, and the guide is not handed to the user's next connection.
func TestCloseStageProvenDuringLinger(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.WriteTimeout = 5 * time.Second })
	ws := tg.dial(t, "pia")
	pingPong(t, ws)
	req := stagePush("pia", redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	tg.mustPush(t, req, push.Delivered)
	readStage(t, ws, req)
	// Sent before reading on, so before the pong to the gateway's ping,
	// which the next read answers.
	ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
	readClose(t, ws)
	ws.Close()
	waitUntil(t, "the connection ends", func() bool { return tg.hub.count("pia") == 0 })
	ws = tg.dial(t, "pia")
	pingPong(t, ws) // the first frame is the pong: no guide handed on
}
