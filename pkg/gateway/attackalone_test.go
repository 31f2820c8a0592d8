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
	"github.com/stillthere/stillthere/pkg/session"
)

// aaloneSilenceRanOut waits for a renewal of uid (a ping on ws, made by
// the caller) and returns a deadline just after it, once Redis's clock is
// past it: the silence that followed that ping ran out (a short one, for
// the test).
func aaloneSilenceRanOut(t *testing.T, tg *testGateway, uid string) int64 {
	t.Helper()
	arRenewedAfter(t, tg, uid, 0)
	renewed, err := tg.store.LastRenewed(context.Background(), uid)
	if err != nil {
		t.Fatal(err)
	}
	deadline := renewed.UnixMilli() + 1
	arClockPast(t, tg.rdb, deadline)
	return deadline
}

// aaloneReadClosed reads ws until it ends, and wants it closed with
// frame.CloseInactive after no other data frame. Reading answers the
// proof ping the flusher sends after the guide (the client proves it).
func aaloneReadClosed(t *testing.T, ws *websocket.Conn) {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(30 * time.Second)) // a bound, not a wait: the close comes once the guide is written
	for {
		_, b, err := ws.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != frame.CloseInactive {
				t.Fatalf("the device's connection ended with %v; want closed for inactivity (%d)", err, frame.CloseInactive)
			}
			return
		}
		t.Fatalf("the device got %s after its close stage's guide; want the close", b)
	}
}

// aaloneRouteNames waits until uid's route names only inst, with count
// connections.
func aaloneRouteNames(t *testing.T, tg *testGateway, uid, inst, count string) {
	t.Helper()
	waitUntil(t, uid+"'s route naming "+inst+" alone", func() bool {
		r := tg.rdb.HGetAll(context.Background(), tg.store.Keyspace().RouteKey(uid)).Val()
		return len(r) == 1 && r[inst] != "" && (count == "" || r[inst] == count)
	})
}

// These tests broke a design that judged a late close stage again where
// it came "alone" (routed to one instance, taken by no connection of the
// routing one): a close applied beside it on that instance went untold,
// and a late reminder went out without its close. A routed or held close
// stage is not judged again; they guard that.

// TestAttackAloneHeldCloseAppliedBesideIt: a user has two devices, both
// on instance B: the phone is connected, and the laptop has just
// reconnected after a network drop (first=ping) and holds its guides
// until its first ping. A silence runs out; the consumer pushes its
// reminder and close stage to instance A, where the user has no
// connection: A's route names B alone, so A marks both Alone and
// publishes them to B. B hands them to both of its connections: the
// phone shows them, and its close is applied (4000: the chat is closed);
// the laptop holds them. The user then comes back through the platform
// (a renewal after the deadline). The laptop's first ping comes more
// than half a second after the claims, its client saying the user has
// been away for 70 s: its held close stage is judged again, because it
// came alone, and dropped as came_back. But a connection did apply its
// close: the phone, beside the laptop on the very instance that got it
// alone. Alone says only that the routing instance took it nowhere, not
// that the instance it goes to has one connection. The laptop is shown
// "are you still there?" and never that the chat was closed; nothing is
// kept for it either (the phone proved the guide, which took its entry
// out of the inbox). A close applied on one device, never told on the
// other.
func TestAttackAloneHeldCloseAppliedBesideIt(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ctx := context.Background()
	uid := "aaheld-" + newToken()[:8]
	phone := b.dial(t, uid)
	pingPong(t, phone)
	deadline := aaloneSilenceRanOut(t, b, uid)
	laptop := b.dialFirstPing(t, uid)
	waitUntil(t, "both devices in B's hub", func() bool { return len(b.hub.lookup(uid)) == 2 })
	aaloneRouteNames(t, a, uid, b.instance, "2")

	// The consumer's pushes, to A, each stamped and claimed by its push.
	remind, closing := arSilence(uid, deadline, 0)
	a.mustPush(t, remind, push.Delivered)
	claimed := redisNowMS(t, a.rdb)
	a.mustPush(t, closing, push.Delivered)
	readGuide(t, phone, remind.ID)
	readGuide(t, phone, closing.ID)
	aaloneReadClosed(t, phone)

	// The user comes back through the platform, after the close.
	if _, err := b.store.Renew(ctx, uid, "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	arRenewedAfter(t, b, uid, deadline)
	// Real time must pass: the laptop's first ping comes more than
	// recheckAge after the claims.
	arClockPast(t, b.rdb, claimed+2*recheckAge.Milliseconds())

	pingSaying(t, laptop, arAwayAgoMS)
	readGuide(t, laptop, remind.ID)
	if m := readJSON(t, laptop); m["type"] != "guide" || m["id"] != closing.ID {
		t.Fatalf("the laptop got %v after the reminder; want the close stage %s: the phone beside it on B applied that close (the chat is closed), and no device is told", m, closing.ID)
	}
}

// TestAttackAloneRoutedReminderWithoutClose: a user's one device is on
// instance B. Instance A, where the user has no connection, claims a
// silence's reminder and close stage and routes both to B alone (marked
// Alone, as A's route marks them); A answers the consumer delivered for
// each. B reads them off its channel more than half a second later (a
// paused process), after the user came back through the platform. B's
// judgement of the late reminder finds the user back, but sends it all
// the same, since the close stage of its silence was claimed and pushed
// (delivered) before the return: "its close goes to the devices, and a
// close must never come before its reminder". The close stage, judged
// again because it came alone, is then dropped as came_back. The device
// shows "are you still there?" to a user who came back, and no close
// ever follows it: the reason the late reminder went out no longer
// holds. Either both stages go out (the rule before the close could be
// dropped there) or neither does; not the reminder alone. And the
// consumer was told delivered for a close no connection got.
func TestAttackAloneRoutedReminderWithoutClose(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ctx := context.Background()
	uid := "aarouted-" + newToken()[:8]
	onB := b.dial(t, uid)
	pingPong(t, onB)
	deadline := aaloneSilenceRanOut(t, b, uid)
	aaloneRouteNames(t, a, uid, b.instance, "")

	claimed := redisNowMS(t, a.rdb)
	remind, closing := arSilence(uid, deadline, claimed)
	// A's pushes: claimed, routed to B alone, settled delivered (B's
	// subscriber took each off the channel).
	for _, req := range []push.Request{remind, closing} {
		tok := newToken()
		if state, err := a.store.ClaimPush(ctx, uid, req.ID, tok, claimTTL, deadline); err != nil || state != session.PushFresh {
			t.Fatalf("A's claim of %s: %q, %v", req.ID, state, err)
		}
		if err := a.store.SettlePush(ctx, uid, req.ID, tok, string(push.Delivered), pushedTTL); err != nil {
			t.Fatal(err)
		}
	}

	// The user comes back through the platform while B is paused.
	if _, err := b.store.Renew(ctx, uid, "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	arRenewedAfter(t, b, uid, deadline)
	arClockPast(t, b.rdb, claimed+2*recheckAge.Milliseconds())

	// B reads what A published, in the order A published it.
	b.readRouted(t, remind, closing)
	pingSaying(t, onB, -1)
	m := readJSON(t, onB)
	if m["type"] == "pong" {
		return // neither stage: the user came back
	}
	if m["type"] != "guide" || m["id"] != remind.ID {
		t.Fatalf("B's device got %v; want the reminder %s and its close, or neither", m, remind.ID)
	}
	if m := readJSON(t, onB); m["type"] != "guide" || m["id"] != closing.ID {
		t.Fatalf("B's device got %v after the reminder %s; want its close stage %s: the reminder went to a user who came back because its close goes to the devices, and the close was then dropped (the consumer was told delivered)", m, remind.ID, closing.ID)
	}
}

// TestAttackAloneHeldReminderWithoutClose: the hold path of the same
// defect. The user's one device reconnects on B after a network drop
// (first=ping) and holds its guides. The consumer pushes the silence's
// reminder and close stage to A, which has no connection of the user and
// routes each to B alone; B's device holds both. The user comes back
// through the platform. The device's first ping comes more than half a
// second after the claims, its client not having seen the user (away
// 70 s): the held reminder, found over, goes out because its close stage
// was pushed before the return; the held close stage, judged again as it
// came alone, is dropped. "Are you still there?" to a user who came back,
// and no close ever follows.
func TestAttackAloneHeldReminderWithoutClose(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ctx := context.Background()
	uid := "aahold-" + newToken()[:8]
	ws := b.dialFirstPing(t, uid)
	aaloneRouteNames(t, a, uid, b.instance, "")
	deadline := redisNowMS(t, b.rdb) - 1000
	remind, closing := arSilence(uid, deadline, 0)
	a.mustPush(t, remind, push.Delivered)
	claimed := redisNowMS(t, a.rdb)
	a.mustPush(t, closing, push.Delivered)

	if _, err := b.store.Renew(ctx, uid, "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	arRenewedAfter(t, b, uid, deadline)
	arClockPast(t, b.rdb, claimed+2*recheckAge.Milliseconds())

	pingSaying(t, ws, arAwayAgoMS)
	m := readJSON(t, ws)
	if m["type"] == "pong" {
		return // neither stage: the user came back
	}
	if m["type"] != "guide" || m["id"] != remind.ID {
		t.Fatalf("the held device got %v; want the reminder %s and its close, or neither", m, remind.ID)
	}
	if m := readJSON(t, ws); m["type"] != "guide" || m["id"] != closing.ID {
		t.Fatalf("the held device got %v after the reminder %s; want its close stage %s: the reminder went to a user who came back because its close goes to the devices, and the close was then dropped (the consumer was told delivered)", m, remind.ID, closing.ID)
	}
}
