package gateway

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on keeping guides ahead of their live delivery, third round:
// what the skips and settled marks of the first two rounds' fixes leave
// behind: an entry leased to a connection that then ends with nobody
// offered it again, a settled mark that refuses a close applied on
// another device, and a close applied elsewhere handed over in place of
// the live close stage a connection holds.

// aa3HandedOn waits until uid's timeline says guide id was handed on by
// a connection that ended before proving it.
func (tg *testGateway) aa3HandedOn(t *testing.T, uid, id string) {
	t.Helper()
	waitUntil(t, "guide "+id+" handed on", func() bool {
		got, err := timeline.Read(context.Background(), tg.store, uid, 0)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(got, func(e timeline.Entry) bool {
			return e.Event == id && strings.HasPrefix(e.Detail, "handed on")
		})
	})
}

// aa3Guides reads ws on a goroutine of its own until it fails, and sends
// the id of each guide it reads. The reads answer the gateway's pings, as
// a client's WebSocket stack does.
func aa3Guides(ws *websocket.Conn) <-chan string {
	ids := make(chan string, 16)
	go func() {
		for {
			var m map[string]any
			if err := ws.ReadJSON(&m); err != nil {
				return
			}
			if m["type"] == "guide" {
				if id, ok := m["id"].(string); ok {
					ids <- id
				}
			}
		}
	}()
	return ids
}

// TestAttackAhead3HandoverCopyLeavesReconnectWithout: device A is live
// and is pushed guide g: kept ahead, queued on A, whose client reads
// nothing yet. Device B connects, and its connect is handed g's entry,
// kept ahead, from the inbox: leased to B, queued on B. A's network goes
// (its live copy unproven): A's hand-on routes g, and B, which has it (as
// an inbox copy), counts as delivered. A's device reconnects (A2), silent:
// its connect finds g leased to B and is handed nothing. Then B's network
// goes too, before B proved g. B's handover releases the lease; its copy,
// an inbox copy, is handed on by nobody. Nothing offers the inbox to A2:
// A2 stays connected, its user silent, and is never handed g, which waits
// in the inbox for a connect that may not come. Before the keep ahead,
// B's copy of g was a live one, handed on to A2 when B ended.
func TestAttackAhead3HandoverCopyLeavesReconnectWithout(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		// No connection is cut off for want of proof meanwhile: each
		// ends when the test ends it.
		c.WriteTimeout = 30 * time.Second
	})
	uid := "aa3-lease"
	wsA := tg.dial(t, uid)
	pingPong(t, wsA) // the user's last renewal, before the deadline
	g := push.Request{ID: "g", UID: uid, Text: "Still there?", DeadlineMS: redisNowMS(t, tg.rdb), Stage: 1}
	if res := tg.mustPush(t, g, push.Delivered); res.Connections != 1 {
		t.Fatalf("delivered to %d connections, want 1", res.Connections)
	}
	wsB := tg.dial(t, uid) // its client reads nothing: no proof
	waitUntil(t, "B's connect leases g's entry", func() bool { return tg.aaLeases(uid) == 1 })

	wsA.NetConn().Close() // A's network is gone before it proved g
	waitUntil(t, "A ends", func() bool { return tg.hub.count(uid) == 1 })
	tg.aa3HandedOn(t, uid, g.ID)

	// A's device reconnects; its connect's take is done once the handler
	// reaches its test hook (after the take, before it returns).
	setup := make(chan struct{}, 1)
	tg.testSetup = func() {
		select {
		case setup <- struct{}{}:
		default:
		}
	}
	wsA2 := tg.dial(t, uid)
	select {
	case <-setup:
	case <-time.After(10 * time.Second):
		t.Fatal("A2's connect never got past its inbox take")
	}
	got := aa3Guides(wsA2) // A2's client reads (and answers pings), and says nothing

	wsB.NetConn().Close() // B's network is gone before it proved g
	waitUntil(t, "B ends and releases its lease", func() bool { return tg.hub.count(uid) == 1 && tg.aaLeases(uid) == 0 })

	handed := waitFor(patience, func() bool {
		select {
		case id := <-got:
			return id == g.ID
		default:
			return false
		}
	})
	if !handed {
		t.Errorf("A2, connected and silent, was never handed g (inbox %v, leases %d): B's handover leased the entry kept ahead while A2 connected, and released it unproven with nobody offered it; g waits for a connect that may not come",
			tg.aaInboxIDs(t, uid), tg.aaLeases(uid))
	}
}

// TestAttackAhead3SupersedeRefusesCloseAppliedLater: device H holds its
// guides until its first ping; device B is live. A silence's close stage
// c is pushed: kept ahead, held by H, written to B, whose close is
// applied (4000); B's client has not proven it yet. H's first ping says
// the user was active just now: H's held copy is superseded, and c's id
// is marked settled. Then B's client is gone before proving c: B hands c
// on to the inbox marked closed, "for the user's next connect or a
// connection they made meanwhile, unless they pinged after it was kept
// there; their client's active_ago_ms does not drop it" (protocol.md).
// H's ping came before the keep. But the keep finds the id settled by
// H's supersede and keeps nothing: H is never handed the close applied on
// B, nor is the next connect. The second round's fix (a supersede leaves
// closed entries) covers only a closed entry kept before the supersede.
// Before the keep ahead, nothing marked the id, and H was handed it.
func TestAttackAhead3SupersedeRefusesCloseAppliedLater(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.firstPingWaitFor = time.Minute
		// B lingers, its close applied, until the test ends it.
		c.WriteTimeout = 30 * time.Second
	})
	uid := "aa3-supfirst"
	ctx := context.Background()
	wsH := tg.dialFirstPing(t, uid)
	wsB := tg.dial(t, uid)
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	if res := tg.mustPush(t, c, push.Delivered); res.Connections != 2 {
		t.Fatalf("delivered to %d connections, want 2", res.Connections)
	}
	readStage(t, wsB, c) // written: B's close is applied; no proof yet

	pingSaying(t, wsH, 0) // the user was active just now, on H
	var before []string
	for {
		m := readJSON(t, wsH)
		if m["type"] == "pong" {
			break
		}
		if m["type"] == "guide" {
			before = append(before, m["id"].(string))
		}
	}
	if slices.Contains(before, c.ID) {
		t.Fatalf("H was handed %v: its word did not supersede the close stage %s", before, c.ID)
	}
	// The supersede took c's entry kept ahead out (it settled the id
	// too, before the fix: no more).
	waitUntil(t, "H's supersede takes c's entry out", func() bool {
		return !slices.Contains(tg.aaInboxIDs(t, uid), c.ID)
	})
	if tg.rdb.HExists(ctx, tg.store.Keyspace().InboxSettledKey(uid), c.ID).Val() {
		t.Errorf("H's supersede settled %s: a close applied later cannot be kept", c.ID)
	}

	got := aa3Guides(wsH)
	wsB.NetConn().Close() // B's client is gone before it proves c
	waitUntil(t, "B ends", func() bool { return tg.hub.count(uid) == 1 })
	told := waitFor(patience, func() bool {
		select {
		case id := <-got:
			if id == c.ID {
				return true
			}
		default:
		}
		return slices.Contains(tg.aaInboxIDs(t, uid), c.ID+"(closed)")
	})
	if !told {
		t.Errorf("the close stage %s, applied on B after H's ping, was neither handed to H nor kept (inbox %v): B's hand-on found the id settled by H's supersede, and kept nothing; the user is never told the chat was closed",
			c.ID, tg.aaInboxIDs(t, uid))
	}
}

// TestAttackAhead3HeldCloseAppliedElsewhereClosesNothing: device H holds
// its guides until its first ping; device B is live. A silence's close
// stage c is pushed: delivered to both, "for a close stage, each closes
// after the frame". B writes it (its close applied) and is gone before
// proving it: c is kept in the inbox marked closed. H's first ping says
// nothing of activity, so the hold ends and nothing is superseded: H's
// held live copy must go out and close H. But the second round's fix
// hands a connection the closed entry even while it holds the live copy:
// the inbox copy goes out first, which closes nothing, and the held live
// copy is then dropped as one H has. The chat on H stays open, its
// session runs on, after a close stage shown on it.
func TestAttackAhead3HeldCloseAppliedElsewhereClosesNothing(t *testing.T) {
	uid := "aa3-heldclosed"
	_, wsH, c := aaCloseAppliedOnB(t, uid)

	pingSaying(t, wsH, -1) // no word of activity: the hold ends, nothing superseded
	readStage(t, wsH, c)
	wsH.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, b, err := wsH.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != 4000 {
		t.Errorf("after the close stage %s, H read %s, %v; want the close 4000: H was handed B's closed inbox copy (which closes nothing) and its held live copy was dropped as a copy, so the chat on H stays open", c.ID, b, err)
	}
}
