package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on keeping a pushed guide in the user's inbox ahead of its live
// delivery (ahead.go): each test looks for a guide lost, shown out of
// order, or a close stage's promise broken by the keep, the drops a proof
// makes, or the settled mark.

// aaInboxIDs is uid's inbox as guide ids, oldest first (the order a
// connect is handed them in).
func (tg *testGateway) aaInboxIDs(t *testing.T, uid string) []string {
	t.Helper()
	raw, err := tg.rdb.LRange(context.Background(), tg.store.Keyspace().InboxKey(uid), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(raw))
	for i := len(raw) - 1; i >= 0; i-- {
		var e struct {
			ID       string `json:"id"`
			ClosedMS int64  `json:"closed_ms"`
		}
		json.Unmarshal([]byte(raw[i]), &e)
		if e.ClosedMS > 0 {
			ids = append(ids, e.ID+"(closed)")
		} else {
			ids = append(ids, e.ID)
		}
	}
	return ids
}

// aaLeases is how many of uid's inbox entries are leased to a connection.
func (tg *testGateway) aaLeases(uid string) int64 {
	return tg.rdb.HLen(context.Background(), tg.store.Keyspace().InboxLeaseKey(uid)).Val()
}

// aaUnproven is how many guides uid's connections here wait proof of.
func (tg *testGateway) aaUnproven(uid string) int {
	n := 0
	for _, c := range tg.hub.lookup(uid) {
		c.mu.Lock()
		n += len(c.unproven())
		c.mu.Unlock()
	}
	return n
}

// aaAck sends the ack of guide id: proof, and no renewal.
func aaAck(t *testing.T, ws *websocket.Conn, id string) {
	t.Helper()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ack","id":"`+id+`"}`)); err != nil {
		t.Fatal(err)
	}
}

// aaGuidesBeforePong pings and returns the ids of the guides read before
// the pong: what a fresh connect was handed from the inbox (queued before
// any frame is answered).
func aaGuidesBeforePong(t *testing.T, ws *websocket.Conn) []string {
	t.Helper()
	pingSaying(t, ws, -1)
	var ids []string
	for {
		m := readJSON(t, ws)
		switch m["type"] {
		case "guide":
			ids = append(ids, m["id"].(string))
		case "pong":
			return ids
		}
	}
}

// TestAttackAheadTrimEvictsQueuedGuide: a user connected nowhere has a
// full inbox (three guides, the cap). Device A connects and is handed
// them, but has not proven them yet (a phone that stops reading). Device B
// connects too: the entries are leased to A, so B is handed none. A guide
// pushed now goes live to both, and is kept in the inbox ahead of that:
// the keep trims the inbox to its cap, and takes out the oldest entry,
// q1, which A was handed and never proved. B proves the live guide; A
// drops. The inbox held three guides nobody proved, and the live one did
// not need a place (B proved it): B, offered the entries A leaves, must be
// handed q1, q2 and q3. Before the keep ahead, a live push did not touch
// the inbox.
func TestAttackAheadTrimEvictsQueuedGuide(t *testing.T) {
	tg := startGateway(t, nil) // InboxSize 3
	uid := "aa-trim"
	now := redisNowMS(t, tg.rdb)
	for _, id := range []string{"q1", "q2", "q3"} {
		tg.mustPush(t, push.Request{ID: id, UID: uid, Text: "Still there?", DeadlineMS: now, Stage: 1}, push.Queued)
	}
	wsA := tg.dial(t, uid) // handed q1..q3, never reads: no proof
	waitUntil(t, "A leased the inbox", func() bool { return tg.aaLeases(uid) == 3 })
	wsB := tg.dial(t, uid)
	g := push.Request{ID: "g", UID: uid, Text: "Still there?", DeadlineMS: now, Stage: 1}
	if res := tg.mustPush(t, g, push.Delivered); res.Connections != 2 {
		t.Fatalf("delivered to %d connections, want 2", res.Connections)
	}
	readGuide(t, wsB, g.ID)
	aaAck(t, wsB, g.ID) // B proves g (an ack renews nothing)
	waitUntil(t, "B's proof takes g out of the inbox", func() bool { return !slices.Contains(tg.aaInboxIDs(t, uid), "g") })

	wsA.NetConn().Close() // A drops, having proven nothing
	// The entries A leased are offered to B as A's handover ends.
	var got []string
	wsB.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(got) < 3 {
		var m map[string]any
		if err := wsB.ReadJSON(&m); err != nil {
			break
		}
		if m["type"] == "guide" {
			got = append(got, m["id"].(string))
		}
	}
	for _, id := range []string{"q1", "q2", "q3"} {
		if !slices.Contains(got, id) {
			t.Errorf("B was handed %v (inbox %v): %s, queued and never proven, is lost; the keep of g ahead of its live delivery trimmed it", got, tg.aaInboxIDs(t, uid), id)
		}
	}
}

// TestAttackAheadAckOfDoubledIDProvesLaterGuide: device A is live, device
// H holds its guides until its first ping. Guides g1 and g2 are pushed:
// kept ahead, queued on A, held by H. H ends before its first frame, and
// gives them back with keepReq, which offers the inbox to A: A is queued
// the inbox copies of g1 and g2 too (a handover copy was not deduplicated
// against a live one; now it is, and an ack proves the first copy of its
// id, either of which stops this). A's client reads the first frame, g1, acks it, and
// dies before it reads g2. The ack takes the last waiting copy of g1 (the
// inbox one, after the live g2) and so proves the live g2, which never
// reached the client: g2 is taken out of the inbox and settled, and the
// next connect is not handed it. Before the keep ahead, the handover
// copy of g2 stayed in the inbox.
func TestAttackAheadAckOfDoubledIDProvesLaterGuide(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.firstPingWaitFor = time.Minute })
	uid := "aa-ack"
	wsA := tg.dial(t, uid)
	wsH := tg.dialFirstPing(t, uid)
	waitUntil(t, "both connections in the hub", func() bool { return tg.hub.count(uid) == 2 })
	now := redisNowMS(t, tg.rdb)
	g1 := push.Request{ID: "g1", UID: uid, Text: "Still there?", DeadlineMS: now, Stage: 1}
	g2 := push.Request{ID: "g2", UID: uid, Text: "Still there?", DeadlineMS: now + 1, Stage: 1}
	tg.mustPush(t, g1, push.Delivered)
	tg.mustPush(t, g2, push.Delivered)

	wsH.Close() // H ends before its first frame: its held copies go back
	waitUntil(t, "H ends", func() bool { return tg.hub.count(uid) == 1 })
	// Since the fix, A is not queued inbox copies of guides it was sent
	// live (a bounded look: the give-back's offer comes within it).
	if waitFor(2*time.Second, func() bool { return tg.aaUnproven(uid) > 2 }) {
		t.Errorf("A was queued inbox copies of the guides it has live: %d waiting for proof", tg.aaUnproven(uid))
	}

	readGuide(t, wsA, g1.ID)
	aaAck(t, wsA, g1.ID)
	waitUntil(t, "A's ack is taken", func() bool { return tg.aaUnproven(uid) < 2 })
	wsA.NetConn().Close() // the client dies before it reads g2
	waitUntil(t, "A ends and releases its leases", func() bool { return tg.hub.count(uid) == 0 && tg.aaLeases(uid) == 0 })

	inbox := tg.aaInboxIDs(t, uid)
	got := aaGuidesBeforePong(t, tg.dial(t, uid))
	if !slices.Contains(got, g2.ID) {
		t.Errorf("the next connect was handed %v (inbox %v): g2, which no client read or acked, is lost; A's ack of g1 proved it", got, inbox)
	}
}

// TestAttackAheadHandoverProofLetsReminderBackAfterClose: H holds its
// guides until its first ping. A silence's reminder r is pushed: kept
// ahead, held by H. Device B connects, is handed r from the inbox, and
// acks it: the handover takes r's entry out, but does not mark it
// settled, as a live proof does. The close stage c comes: kept ahead,
// held by H, written to B, which closes; B dies before proving it, and
// its close stage is kept closed, replacing c's entry (the newest now).
// H then ends before its first frame and gives back r and c: r was kept
// again, after c, and the next connect was handed the close before its
// reminder. Now B's proof of r settles it, and r is not kept again.
func TestAttackAheadHandoverProofLetsReminderBackAfterClose(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.firstPingWaitFor = time.Minute })
	uid := "aa-order"
	wsH := tg.dialFirstPing(t, uid)
	deadline := redisNowMS(t, tg.rdb)
	r := stagePush(uid, deadline, 1, timeoutevent.ActionRemind)
	tg.mustPush(t, r, push.Delivered) // held by H

	wsB := tg.dial(t, uid)
	readStage(t, wsB, r) // from the inbox
	aaAck(t, wsB, r.ID)  // proof, no renewal
	waitUntil(t, "B's proof takes r out of the inbox", func() bool { return len(tg.aaInboxIDs(t, uid)) == 0 })

	c := stagePush(uid, deadline, 2, timeoutevent.ActionClose)
	tg.mustPush(t, c, push.Delivered) // held by H, written to B
	readStage(t, wsB, c)
	wsB.NetConn().Close() // B dies before proving it
	waitUntil(t, "B's close stage kept closed", func() bool {
		return tg.hub.count(uid) == 1 && slices.Equal(tg.aaInboxIDs(t, uid), []string{c.ID + "(closed)"})
	})

	wsH.Close() // H ends before its first frame: r and c go back
	waitUntil(t, "H ends", func() bool { return tg.hub.count(uid) == 0 })
	// Every connection's bookkeeping is done (H's give-back, its hand-on)
	// once the gateway's connection goroutines are: none is connected.
	idle := make(chan struct{})
	go func() { tg.conns.Wait(); close(idle) }()
	waitUntil(t, "H's guides given back", func() bool {
		select {
		case <-idle:
			return true
		default:
			return false
		}
	})
	inbox := tg.aaInboxIDs(t, uid)
	got := aaGuidesBeforePong(t, tg.dial(t, uid))
	ir, ic := slices.Index(got, r.ID), slices.Index(got, c.ID)
	if ir >= 0 && ic >= 0 && ic < ir {
		t.Errorf("the next connect was handed %v (inbox %v): the close stage %s before its reminder %s", got, inbox, c.ID, r.ID)
	}
}

// TestAttackAheadHeldCloseStageNotApplied: a close stage pushed to a user
// whose one connection holds its guides (first=ping) is answered
// delivered, to 1 connection: "for a close stage, each closes after the
// frame". The client's first ping says nothing of activity, so the hold
// ends and the guide is sent. But it was kept ahead in the inbox too, and
// the hold's end hands the inbox over first: the inbox copy goes out,
// which closes nothing (inbox copies never do), and the held live copy is
// dropped as one the connection has. The chat stays open and the session
// runs on: the close stage was shown and not applied. Before the keep
// ahead, the held copy was sent, and the connection closed with 4000.
func TestAttackAheadHeldCloseStageNotApplied(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.firstPingWaitFor = time.Minute })
	uid := "aa-heldclose"
	ws := tg.dialFirstPing(t, uid)
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	if res := tg.mustPush(t, c, push.Delivered); res.Connections != 1 {
		t.Fatalf("delivered to %d connections, want 1", res.Connections)
	}
	pingSaying(t, ws, -1) // no word of activity: the hold ends, nothing superseded
	readStage(t, ws, c)
	readClose(t, ws)
}
