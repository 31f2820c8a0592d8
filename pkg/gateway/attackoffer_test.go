package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on the live copy of a close stage that finds its connection
// sent the inbox copy (closesAfterCopy): it is queued silent, and closes
// the connection once that copy is written. Each test looks for a
// connection closed that must stay open, one left open that must close,
// a guide shown twice, or an entry lost.

// aofKeepAhead keeps c in its user's inbox as a push's route keeps it
// ahead of its live delivery (keepAhead).
func (tg *testGateway) aofKeepAhead(t *testing.T, c push.Request) {
	t.Helper()
	payload, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := tg.store.KeepGuide(context.Background(), c.UID, session.Keep{Entry: payload, MaxAge: tg.cfg.guideMaxAge(), TTL: tg.cfg.InboxTTL}); err != nil || n != session.KeptQueued {
		t.Fatalf("keep ahead: %d, %v", n, err)
	}
}

// aofServed returns once ws's connect is done (its route written, its
// inbox taken) and it is read: a frame of an unknown type is answered
// with an error, and neither renews nor proves anything.
func aofServed(t *testing.T, ws *websocket.Conn) {
	t.Helper()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"aof-unknown"}`)); err != nil {
		t.Fatal(err)
	}
	if m := readJSON(t, ws); m["type"] != frame.TypeError {
		t.Fatalf("got %v, want the error frame", m)
	}
}

// aofStillOpen pings on ws and wants the pong: the connection was not
// closed. what says who ws is, for the failure.
func aofStillOpen(t *testing.T, ws *websocket.Conn, what string) {
	t.Helper()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
		t.Fatalf("%s: write a ping: %v", what, err)
	}
	ws.SetReadDeadline(time.Now().Add(patience))
	defer ws.SetReadDeadline(time.Time{})
	for {
		var m map[string]any
		err := ws.ReadJSON(&m)
		var ce *websocket.CloseError
		switch {
		case errors.As(err, &ce):
			t.Fatalf("%s was closed %d %q; want it open", what, ce.Code, ce.Text)
		case err != nil:
			t.Fatalf("%s: read: %v; want a pong", what, err)
		case m["type"] == "pong":
			return
		default:
			t.Fatalf("%s got %v; want a pong", what, m)
		}
	}
}

// TestAttackOfferCameBackNotClosed: a close stage c is pushed on another
// instance, which keeps it ahead in the inbox and writes it to the
// user's device there: its close is applied (decided), and that device
// has not proven it yet, so the entry stays (or, its client gone, c is
// kept marked closed). Device D is connected here, silent, so the push
// routes c here too. The user then comes back on a new device B here,
// after the close: B's connect is handed c from the inbox, which closes
// nothing (the user is back, on that connection; see inactive.go and
// handover.queue), B proves it, and B's ping renews the session. Then a
// live copy of c reaches this instance: the routed copy read late off
// the channel, or the consumer's resend of c after its first push's
// claim lapsed (its gateway died). D, connected when the chat was
// closed, is told and closed. B must stay open: it was opened after the
// close and was told of it, and the live copy adds nothing to the copy
// B proved. Before the change, the live copy was dropped on B as a copy
// it had. With it, closesAfterCopy takes any inbox copy sent before for
// one an offer handed a device that was there at the close, and closes B
// with 4000 "inactive": the user who came back, and pinged, is closed as
// inactive, and the session their ping renewed is ended.
func TestAttackOfferCameBackNotClosed(t *testing.T) {
	routed := func(t *testing.T, tg *testGateway, c push.Request) { tg.readRouted(t, c) }
	resent := func(t *testing.T, tg *testGateway, c push.Request) {
		// B, opened after the close was applied, is not written it.
		if res := tg.mustPush(t, c, push.Delivered); res.Connections != 1 {
			t.Fatalf("resend delivered to %d connections, want 1 (D)", res.Connections)
		}
	}
	for _, tc := range []struct {
		name string
		uid  string
		// closed: the other device's client was gone before proving
		// c, and c is kept marked closed (handOn) before B connects.
		closed bool
		arrive func(t *testing.T, tg *testGateway, c push.Request)
	}{
		{"routed copy read late", "aof-back-routed", false, routed},
		{"resend after the claim lapsed", "aof-back-resend", false, resent},
		{"routed copy read late, close kept closed", "aof-back-closed", true, routed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			uid := tc.uid
			tg := startGateway(t, func(c *Config) {
				c.WriteTimeout = 30 * time.Second
				// No route refresh (its minute's cycle may come at any
				// time) offers D the inbox: B's connect takes the entry.
				c.routeRefreshEvery = time.Hour
			})
			wsD := tg.dial(t, uid) // there, silent, when the chat is closed
			aofServed(t, wsD)
			c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
			// The other instance's push: kept ahead, and written to the
			// device there, which decided its close applied.
			tg.aofKeepAhead(t, c)
			if applied, err := tg.store.CommitClose(ctx, uid, c.ID, c.DeadlineMS, pushedTTL); err != nil || !applied {
				t.Fatalf("the close applied on the other instance's device: %v, %v", applied, err)
			}
			if tc.closed {
				// Kept by the other instance, which offers it only to
				// its own connections.
				payload, err := json.Marshal(c)
				if err != nil {
					t.Fatal(err)
				}
				if n, err := tg.store.KeepGuide(ctx, uid, session.Keep{Entry: payload, MaxAge: tg.cfg.guideMaxAge(), Cap: tg.cfg.InboxSize,
					TTL: tg.cfg.InboxTTL, Closed: true}); err != nil || n != session.KeptQueued {
					t.Fatalf("keep c closed: %d, %v", n, err)
				}
				if got, want := tg.aaInboxIDs(t, uid), []string{c.ID + "(closed)"}; !slices.Equal(got, want) {
					t.Fatalf("inbox %v, want %v", got, want)
				}
			}

			// The user comes back, on a new device, clearly after the
			// close (B's openedMS is an estimate, early by a moment).
			closedAt, err := tg.store.CloseAppliedAt(ctx, uid, c.ID)
			if err != nil || closedAt == 0 {
				t.Fatalf("the close applied at %d, %v", closedAt, err)
			}
			waitUntil(t, "Redis's clock past the close", func() bool { return redisNowMS(t, tg.rdb) > closedAt+100 })
			wsB := tg.dial(t, uid)
			readStage(t, wsB, c) // handed from the inbox on connect
			aaAck(t, wsB, c.ID)
			pingPong(t, wsB) // renews: the user is back
			waitUntil(t, "B's inbox copy proven, and out of the inbox", func() bool {
				return len(tg.aaInboxIDs(t, uid)) == 0 && tg.aaLeases(uid) == 0
			})

			tc.arrive(t, tg, c)
			readStage(t, wsD, c)
			readClose(t, wsD)
			aofStillOpen(t, wsB, "B, opened after the close and handed it from the inbox,")
			if !sessionExists(tg, uid) {
				t.Error("the user who came back on B has no session")
			}
		})
	}
}

// TestAttackOfferProvenFirstStillCloses: device B, connected and silent,
// is offered the entry of close stage c kept ahead of its live copy, and
// proves it (an ack) before the live copy arrives: the entry leaves the
// inbox. The live copy then finds c proven on B: it writes nothing (B
// must not be shown c twice), and still closes B after it, with no proof
// to wait for. Before the change, B was left open.
func TestAttackOfferProvenFirstStillCloses(t *testing.T) {
	uid := "aof-proven"
	tg := startGateway(t, func(c *Config) { c.WriteTimeout = 30 * time.Second })
	wsB := tg.dial(t, uid)
	aofServed(t, wsB)
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	tg.aofKeepAhead(t, c)
	tg.offerInbox(context.Background(), uid)
	readStage(t, wsB, c)
	aaAck(t, wsB, c.ID) // proof, and no renewal
	waitUntil(t, "B's inbox copy proven, and out of the inbox", func() bool {
		return len(tg.aaInboxIDs(t, uid)) == 0 && tg.aaLeases(uid) == 0
	})
	if res := tg.mustPush(t, c, push.Delivered); res.Connections != 1 {
		t.Fatalf("delivered to %d connections, want 1", res.Connections)
	}
	readClose(t, wsB) // no second guide frame before the close
	waitUntil(t, "B ends", func() bool { return tg.hub.count(uid) == 0 })
}

// TestAttackOfferResendAddsNothing: B, connected and silent, is offered
// the entry of close stage c kept ahead; its live copy then reaches B
// twice (a routed copy and the consumer's resend, say). B's client reads
// its frames but answers no ping, and acks nothing: it is shown c once
// and closed once, and, gone before proving c, c is kept marked closed
// once.
func TestAttackOfferResendAddsNothing(t *testing.T) {
	uid := "aof-resend"
	tg := startGateway(t, func(c *Config) { c.WriteTimeout = 30 * time.Second })
	wsB := tg.dial(t, uid)
	aofServed(t, wsB)
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	tg.aofKeepAhead(t, c)
	tg.offerInbox(context.Background(), uid)
	waitUntil(t, "the offer hands B the entry", func() bool { return tg.aaLeases(uid) == 1 })
	wsB.SetPingHandler(func(string) error { return nil }) // proves nothing
	tg.readRouted(t, c, c)
	readStage(t, wsB, c)
	// The close follows at once: a second guide frame would come first.
	wsB.SetReadDeadline(time.Now().Add(patience))
	var m map[string]any
	err := wsB.ReadJSON(&m)
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != frame.CloseInactive {
		t.Fatalf("after c, B read %v, %v; want the close 4000 and nothing before it", m, err)
	}
	wsB.NetConn().Close()
	want := []string{c.ID + "(closed)"}
	if !waitFor(patience, func() bool { return tg.hub.count(uid) == 0 && slices.Equal(tg.aaInboxIDs(t, uid), want) }) {
		t.Fatalf("inbox %v, want %v", tg.aaInboxIDs(t, uid), want)
	}
}

// TestAttackOfferEndedBetween: B, connected and silent, is offered the
// entry of close stage c kept ahead, reads it, and its client is gone
// before proving it and before the live copy comes. Its close was never
// applied (the inbox copy closes nothing, and no live copy was written):
// the live copy finds the user connected nowhere, is kept, and the next
// connect is handed c once, unclosed, and stays open: nothing lost.
func TestAttackOfferEndedBetween(t *testing.T) {
	uid := "aof-between"
	tg := startGateway(t, func(c *Config) { c.WriteTimeout = 30 * time.Second })
	wsB := tg.dial(t, uid)
	aofServed(t, wsB)
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	tg.aofKeepAhead(t, c)
	tg.offerInbox(context.Background(), uid)
	readStage(t, wsB, c)
	wsB.NetConn().Close()
	waitUntil(t, "B ends, and its lease is released", func() bool {
		return tg.hub.count(uid) == 0 && tg.aaLeases(uid) == 0
	})
	tg.mustPush(t, c, push.Queued)
	if got, want := tg.aaInboxIDs(t, uid), []string{c.ID}; !slices.Equal(got, want) {
		t.Fatalf("inbox %v, want %v", got, want)
	}
	ws := tg.dial(t, uid)
	if got := aaGuidesBeforePong(t, ws); !slices.Equal(got, []string{c.ID}) {
		t.Fatalf("the next connect was handed %v, want [%s]", got, c.ID)
	}
	aofStillOpen(t, ws, "the next connect, handed c from the inbox,")
}

// TestAttackOfferTwoInstances: device A is on instance P, device B on
// instance Q, both silent. Close stage c is kept ahead, and an offer of
// the inbox on Q hands B the entry before c's push on P routes the live
// copy to Q. Both devices are shown c once, and both are closed.
func TestAttackOfferTwoInstances(t *testing.T) {
	uid := "aof-two"
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	mutate := func(c *Config) { c.WriteTimeout = 30 * time.Second }
	p := startGatewayOn(t, []string{srv.Addr}, prefix, mutate)
	q := startGatewayOn(t, []string{srv.Addr}, prefix, mutate)
	wsA := p.dial(t, uid)
	wsB := q.dial(t, uid)
	aofServed(t, wsA)
	aofServed(t, wsB)
	c := stagePush(uid, redisNowMS(t, p.rdb), 2, timeoutevent.ActionClose)
	p.aofKeepAhead(t, c)
	q.offerInbox(context.Background(), uid)
	waitUntil(t, "the offer on Q hands B the entry", func() bool { return q.aaLeases(uid) == 1 })
	if res := p.mustPush(t, c, push.Delivered); res.Connections != 2 {
		t.Fatalf("delivered to %d connections, want 2", res.Connections)
	}
	for _, ws := range []*websocket.Conn{wsA, wsB} {
		readStage(t, ws, c)
		readClose(t, ws)
	}
	waitUntil(t, "both end", func() bool { return p.hub.count(uid) == 0 && q.hub.count(uid) == 0 })
}

// TestAheadLaterChunkStillCloses: device B connects, silent, to a full
// inbox (its chunk is one guide): its connect's take hands it the old
// reminder r, and B proves it only after close stage c was kept ahead of
// its live copy, and its close applied on another device. The next
// chunk's take hands B c: B was there when the chat closed, its user
// silent, and c's live copy, when it reaches B, must close it (4000)
// without showing c again. Taken as the connect's own take, the inbox
// copy closed nothing and the live copy was dropped as a copy: B was
// shown the close, left open, and its session not ended.
func TestAheadLaterChunkStillCloses(t *testing.T) {
	ctx := context.Background()
	uid := "aof-later-chunk"
	tg := startGateway(t, func(c *Config) {
		c.SendQueue = 2 // a chunk of one guide
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour // only the handover hands the inbox
	})
	now := redisNowMS(t, tg.rdb)
	r := push.Request{ID: "r", UID: uid, Text: "Still there?", DeadlineMS: now, Stage: 1}
	tg.mustPush(t, r, push.Queued) // connected nowhere: kept

	wsB := tg.dial(t, uid)
	readGuide(t, wsB, r.ID) // the connect's take; not proven yet
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	tg.aofKeepAhead(t, c)
	if applied, err := tg.store.CommitClose(ctx, uid, c.ID, c.DeadlineMS, pushedTTL); err != nil || !applied {
		t.Fatalf("the close applied on the other instance's device: %v, %v", applied, err)
	}
	aaAck(t, wsB, r.ID) // proof, and no renewal: the next chunk is taken
	readStage(t, wsB, c)
	waitUntil(t, "c leased to B's handover", func() bool { return tg.aaLeases(uid) == 1 })

	tg.readRouted(t, c)
	readClose(t, wsB)
	waitUntil(t, "B ends", func() bool { return tg.hub.count(uid) == 0 })
}

// TestAheadOfferedCloseThenPingStillCloses: device D, connected and
// silent when close stage c was kept ahead of its live copy and its close
// applied elsewhere, is offered c's entry, reads it, acks it, and pings.
// The chat was closed while D's user was silent, and D was told so: the
// close frame promises a 4000 right after it (see docs/protocol.md), and
// the live copy, read late, brings it. A ping after a close frame does
// not reopen the chat, here as when the live copy comes first; the user
// starts a new session by connecting again.
func TestAheadOfferedCloseThenPingStillCloses(t *testing.T) {
	ctx := context.Background()
	uid := "aof-ping-after"
	tg := startGateway(t, func(c *Config) {
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour // only the test offers the inbox
	})
	wsD := tg.dial(t, uid)
	aofServed(t, wsD)
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	tg.aofKeepAhead(t, c)
	if applied, err := tg.store.CommitClose(ctx, uid, c.ID, c.DeadlineMS, pushedTTL); err != nil || !applied {
		t.Fatalf("the close applied on the other instance's device: %v, %v", applied, err)
	}
	tg.offerInbox(ctx, uid)
	readStage(t, wsD, c)
	aaAck(t, wsD, c.ID)
	pingPong(t, wsD)
	waitUntil(t, "D's inbox copy proven, and out of the inbox", func() bool {
		return len(tg.aaInboxIDs(t, uid)) == 0 && tg.aaLeases(uid) == 0
	})
	tg.readRouted(t, c)
	readClose(t, wsD) // no second guide frame before it
	waitUntil(t, "D ends", func() bool { return tg.hub.count(uid) == 0 })
}
