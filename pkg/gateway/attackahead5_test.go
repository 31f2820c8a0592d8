package gateway

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on keeping guides ahead of their live delivery, fifth round:
// the closed entry of a close applied on another device that a holding
// connection's handover leaves to its held copy, and handClosed, which
// tells it on that connection when the client's word supersedes the
// held copy.

// aa5Frames reads ws until its pong and returns the guide ids read
// before it.
func aa5Frames(t *testing.T, ws *websocket.Conn) []string {
	t.Helper()
	var got []string
	for {
		m := readJSON(t, ws)
		if m["type"] == "pong" {
			return got
		}
		if m["type"] == "guide" {
			got = append(got, m["id"].(string))
		}
	}
}

// aa5ReadFor reads ws for up to d (real time must pass: nothing signals
// that a guide will not come), acking each guide, and returns their ids.
func aa5ReadFor(t *testing.T, ws *websocket.Conn, d time.Duration) []string {
	t.Helper()
	var got []string
	ws.SetReadDeadline(time.Now().Add(d))
	defer ws.SetReadDeadline(time.Time{})
	for {
		var m map[string]any
		if err := ws.ReadJSON(&m); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Logf("read: %v", err)
			}
			return got
		}
		if m["type"] == "guide" {
			id := m["id"].(string)
			got = append(got, id)
			aaAck(t, ws, id)
		}
	}
}

// aaCloseAppliedOnB is the start the ahead rounds share for uid: device
// H holds its guides until its first ping; close stage c is delivered to
// H and to device B, whose close is applied; B's client is gone before it
// proves it, and c is kept in the inbox marked closed.
func aaCloseAppliedOnB(t *testing.T, uid string) (tg *testGateway, wsH *websocket.Conn, c push.Request) {
	t.Helper()
	tg = startGateway(t, func(c *Config) { c.firstPingWaitFor = time.Minute })
	wsH = tg.dialFirstPing(t, uid)
	cH := tg.hub.lookup(uid)[0]
	wsB := tg.dial(t, uid)
	var cB *conn
	for _, cn := range tg.hub.lookup(uid) {
		if cn != cH {
			cB = cn
		}
	}
	c = stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	if res := tg.mustPush(t, c, push.Delivered); res.Connections != 2 {
		t.Fatalf("delivered to %d connections, want 2", res.Connections)
	}
	readStage(t, wsB, c)
	// B's close is applied once its live copy is written. B's connect
	// may cross the push and be handed the inbox's copy first (see
	// handover.there): the frame read is that copy, and the live copy
	// that follows it on B's flusher (not written again) applies the
	// close. A client gone before that ends B with its close not
	// applied, and c is kept unclosed: not this start.
	waitUntil(t, "B's close applied", cB.inactive)
	wsB.NetConn().Close() // B's client is gone before it proves it
	want := []string{c.ID + "(closed)"}
	if !waitFor(patience, func() bool {
		return tg.hub.count(uid) == 1 && slices.Equal(tg.aaInboxIDs(t, uid), want)
	}) {
		t.Fatalf("timed out waiting for B's applied close stage kept closed: %d connections in the hub (want 1, H), inbox %v (want %v)",
			tg.hub.count(uid), tg.aaInboxIDs(t, uid), want)
	}
	return tg, wsH, c
}

// aa5LeasedToB2 is the fifth round's start for uid: device H holds its
// guides until its first ping; close stage c is held by H and written to
// device B, whose close is applied; B's client is gone before it proves
// it, and c is kept closed; device B2 connects and is handed c's entry
// (leased to its handover), but its client reads nothing.
func aa5LeasedToB2(t *testing.T, uid string) (tg *testGateway, wsH, wsB2 *websocket.Conn, c push.Request) {
	t.Helper()
	tg, wsH, c = aaCloseAppliedOnB(t, uid)
	wsB2 = tg.dial(t, uid) // handed c from the inbox; reads nothing yet
	waitUntil(t, "c leased to B2's handover", func() bool { return tg.aaLeases(uid) == 1 })
	return tg, wsH, wsB2, c
}

// TestAttackAhead5HeldCloseLeasedElsewhereLost: the second round's
// supersede attack, with the closed entry leased to another device's
// handover at H's hold's end. Device H holds its guides until its first
// ping; device B is live. Close stage c is pushed: held by H, written to
// B, whose close is applied; B's client is gone before it proves it, and
// c is kept closed. Device B2 connects and is handed c's entry (leased to
// its handover), but its client reads nothing yet. H's first ping says
// the user was active just now: the hold's take finds c's entry leased,
// and hands H nothing (no handover, so handClosed is never asked); H's
// word supersedes the held copy; the offer that follows finds the entry
// leased still. B2's network goes, unproven: its lease is released, and
// the next take finds the closed entry stale by H's first ping's renewal
// and drops it. The close applied on B is told neither on H nor on any
// later connect.
func TestAttackAhead5HeldCloseLeasedElsewhereLost(t *testing.T) {
	uid := "aa5-leased"
	tg, wsH, wsB2, c := aa5LeasedToB2(t, uid)

	pingSaying(t, wsH, 0) // the user was active just now, on H
	got := aa5Frames(t, wsH)
	for _, id := range got {
		aaAck(t, wsH, id)
	}
	wsB2.NetConn().Close() // B2's client is gone, having read nothing
	// B2's lease is released when it ends, unless H holds the entry by
	// then (told).
	waitUntil(t, "B2 ends", func() bool { return tg.hub.count(uid) == 1 })
	// Whatever the offers of the released entry do is done within this.
	got = append(got, aa5ReadFor(t, wsH, 3*time.Second)...)
	if slices.Contains(got, c.ID) {
		return // told on H
	}
	inbox := tg.aaInboxIDs(t, uid)
	next := aaGuidesBeforePong(t, tg.dial(t, uid))
	if !slices.Contains(next, c.ID) {
		tl, _ := timeline.Read(context.Background(), tg.store, uid, 0)
		for _, e := range tl {
			t.Logf("timeline: %s %s", e.Event, e.Detail)
		}
		t.Errorf("H was handed %v, the inbox held %v, and the next connect was handed %v: the close stage %s, whose close was applied on B, is lost; H's word superseded its held copy while the closed entry was leased to B2, which never proved it, and the entry was then stale by H's first ping's renewal", got, inbox, next, c.ID)
	}
}

// TestAheadCloseLeftForTheDeviceOpenBeforeIt: the fifth round's attack
// with the order a busy host gave it once: after H's first ping renewed,
// the user's inbox is offered again while B2 is still connected (as the
// offer that follows H's hold's end does), and B2's handover takes it
// again. c's closed entry is stale for B2, opened after the close, but
// still owed to H: that take must leave it, not drop it, so that H is
// told once B2's lease is released.
func TestAheadCloseLeftForTheDeviceOpenBeforeIt(t *testing.T) {
	uid := "aa5-left"
	tg, wsH, wsB2, c := aa5LeasedToB2(t, uid)

	pingSaying(t, wsH, 0)
	got := aa5Frames(t, wsH)
	for _, id := range got {
		aaAck(t, wsH, id)
	}
	// The inbox offered again with B2 still here: B2's take finds c
	// stale for it, by H's renewal.
	tg.offerInbox(t.Context(), uid)
	if ids := tg.aaInboxIDs(t, uid); !slices.Contains(got, c.ID) && !slices.Equal(ids, []string{c.ID + "(closed)"}) {
		t.Fatalf("after B2's second take the inbox holds %v, want %s(closed) left for H", ids, c.ID)
	}
	wsB2.NetConn().Close()
	waitUntil(t, "B2 ends", func() bool { return tg.hub.count(uid) == 1 })
	got = append(got, aa5ReadFor(t, wsH, 3*time.Second)...)
	if !slices.Contains(got, c.ID) {
		t.Errorf("H was handed %v, the inbox holds %v: the close applied on B, owed to H, open since before it, was never told there", got, tg.aaInboxIDs(t, uid))
	}
}
