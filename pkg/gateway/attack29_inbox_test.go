package gateway

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/push"
)

// A connect skips its inbox take when its route write found the inbox
// empty. The argument: a guide kept after the write was kept with a route
// check, which refuses when a count rose since the keeper read the route.
// These tests look for keeps after the write that the argument does not
// cover, each leaving a guide in the inbox while the user is connected.
// Before the change, the connect's take came just after its write: a keep
// that landed between the two was handed over, one that landed after the
// take waited too. The first three tests land their keep right after the
// write, and so passed or failed by that race before. A keep now offers
// the inbox to the user's connections here (see keep), whatever the
// route check found.

// a29RouteCount is this instance's count in uid's route key ("" if none).
func (tg *testGateway) a29RouteCount(t *testing.T, uid string) string {
	t.Helper()
	v, err := tg.rdb.HGet(context.Background(), tg.store.Keyspace().RouteKey(uid), tg.instance).Result()
	if err != nil {
		return ""
	}
	return v
}

// a29WaitCount waits until this instance's count in uid's route is want.
func (tg *testGateway) a29WaitCount(t *testing.T, uid, want string) {
	t.Helper()
	waitUntil(t, uid+"'s route count "+want, func() bool { return tg.a29RouteCount(t, uid) == want })
}

// a29Inbox is how many entries uid's inbox holds.
func (tg *testGateway) a29Inbox(t *testing.T, uid string) int64 {
	t.Helper()
	n, err := tg.rdb.LLen(context.Background(), tg.store.Keyspace().InboxKey(uid)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// a29ReadGuide reads frames until the guide id comes (true) or d passes
// (false); other frames are skipped.
func a29ReadGuide(ws *websocket.Conn, id string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		ws.SetReadDeadline(deadline)
		_, b, err := ws.ReadMessage()
		if err != nil {
			return false
		}
		var m map[string]any
		if json.Unmarshal(b, &m) == nil && m["type"] == "guide" && m["id"] == id {
			return true
		}
	}
}

// TestAttack29KeepAfterReconnectAtSameCount: the route check compares
// counts, so a drop and a reconnect on the same instance (1, 0, 1; or a
// single write of 1 when their marks coalesce in routeBook) leaves the
// count where the keeper read it. A push that read the route while the
// old connection was there, and found it gone from the hub, keeps the
// guide after the new connection's write: the check lets it through, and
// the write had found the inbox empty, so the new connection never takes
// it. The push's steps are run in that order by hand (route reads the
// route, deliverLocal finds nobody, keep checks the route).
func TestAttack29KeepAfterReconnectAtSameCount(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	uid := "a29-aba"
	wsA := tg.dial(t, uid)
	tg.a29WaitCount(t, uid, "1")

	// The push reads the route while A is connected.
	routes, err := tg.rdb.HGetAll(ctx, tg.store.Keyspace().RouteKey(uid)).Result()
	if err != nil {
		t.Fatal(err)
	}
	// A drops; deliverLocal, run now, finds nobody.
	wsA.Close()
	waitUntil(t, "A out of the hub", func() bool { return len(tg.hub.lookup(uid)) == 0 })
	req := push.Request{ID: "a29-aba-1", UID: uid, Text: "Still there?"}
	if n, _, _, _ := tg.deliverLocal(context.Background(), req); n != 0 {
		t.Fatalf("deliverLocal after A ended: %d", n)
	}
	tg.a29WaitCount(t, uid, "")

	// The user reconnects here, and its route write finds the inbox empty.
	wsB := tg.dial(t, uid)
	tg.a29WaitCount(t, uid, "1")

	// The push keeps, checking the route it read.
	payload, _ := json.Marshal(req)
	status, err := tg.keep(ctx, req, payload, routes, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if status == "" {
		return // refused: the push routes again and finds B
	}
	if !a29ReadGuide(wsB, req.ID, 5*time.Second) {
		t.Errorf("keep after B's route write answered %q (route read at count 1, now 1 again), and B never got the guide; inbox holds %d entries while B is connected",
			status, tg.a29Inbox(t, uid))
	}
}

// TestAttack29HeldGuideGivenBackAfterConnect: a connection that holds its
// guides (first=ping) and ends before its first frame gives them back to
// the inbox with keepReq, which checks no route, and nothing offers the
// inbox to the user's other connections. A connection that connected
// after the guide was held found the inbox empty at its write, and never
// takes it.
func TestAttack29HeldGuideGivenBackAfterConnect(t *testing.T) {
	tg := startGateway(t, nil)
	uid := "a29-held"
	wsA := tg.dialFirstPing(t, uid)
	tg.a29WaitCount(t, uid, "1")
	req := push.Request{ID: "a29-held-1", UID: uid, Text: "Still there?"}
	tg.mustPush(t, req, push.Delivered) // held by A, unsent

	wsB := tg.dial(t, uid)
	tg.a29WaitCount(t, uid, "2")

	// A ends before its first ping: the held guide goes back to the inbox.
	wsA.Close()
	waitUntil(t, "A out of the hub", func() bool { return len(tg.hub.lookup(uid)) == 1 })
	if !a29ReadGuide(wsB, req.ID, 5*time.Second) {
		t.Errorf("the guide A held went back to the inbox (%d entries) while B is connected, and B never got it", tg.a29Inbox(t, uid))
	}
}

// TestAttack29RoutedInKeptAfterConnect: a guide routed here from another
// instance, for a user whose connections here ended, is kept by routedIn
// without a route check and without an offer. The listener found nobody
// in the hub; a reconnect here then wrote its route, found the inbox
// empty, and skipped its take; the keep lands after. routedIn's steps are
// run in that order by hand (deliverLocal, then the keep it makes).
func TestAttack29RoutedInKeptAfterConnect(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	uid := "a29-routedin"
	wsA := tg.dial(t, uid)
	tg.a29WaitCount(t, uid, "1")
	wsA.Close()
	waitUntil(t, "A out of the hub", func() bool { return len(tg.hub.lookup(uid)) == 0 })

	// The guide comes in on the channel: nobody here.
	req := push.Request{ID: "a29-routedin-1", UID: uid, Text: "Still there?"}
	if n, _, _, _ := tg.deliverLocal(context.Background(), req); n != 0 {
		t.Fatalf("deliverLocal after A ended: %d", n)
	}
	wsB := tg.dial(t, uid)
	tg.a29WaitCount(t, uid, "1")

	payload, _ := json.Marshal(req)
	if _, err := tg.keep(ctx, req, payload, nil, false, false); err != nil {
		t.Fatal(err)
	}
	if !a29ReadGuide(wsB, req.ID, 5*time.Second) {
		t.Errorf("a guide routed in as A ended was kept after B's route write (%d entries) while B is connected, and B never got it", tg.a29Inbox(t, uid))
	}
}

// TestAttack29HeldGuideDoubled: a guide pushed while the user has a
// holding connection A and a live one B reaches B, and is held by A. When
// A ends before its first frame, the held copy goes back to the inbox,
// and the user's next connect shows it again. B proves it got the guide
// (a client that does not would be cut off, and its copy handed on): the
// guide, kept ahead of its delivery, leaves the inbox then, and is
// settled, so that A's copy is not kept again.
func TestAttack29HeldGuideDoubled(t *testing.T) {
	tg := startGateway(t, nil)
	uid := "a29-double"
	wsA := tg.dialFirstPing(t, uid)
	tg.a29WaitCount(t, uid, "1")
	wsB := tg.dial(t, uid)
	tg.a29WaitCount(t, uid, "2")
	req := push.Request{ID: "a29-double-1", UID: uid, Text: "Still there?"}
	res := tg.mustPush(t, req, push.Delivered)
	if !a29ReadGuide(wsB, req.ID, 5*time.Second) {
		t.Fatalf("B never got the guide (push: %+v)", res)
	}
	pingPong(t, wsB) // reading on answers the gateway's ping: proof
	waitUntil(t, "B's proof takes the guide out of the inbox", func() bool { return tg.a29Inbox(t, uid) == 0 })
	wsA.Close()
	if !waitFor(5*time.Second, func() bool { return tg.a29Inbox(t, uid) > 0 }) {
		return // A's held copy was not kept: nothing to show twice
	}

	wsC := tg.dial(t, uid)
	if a29ReadGuide(wsC, req.ID, 3*time.Second) {
		t.Errorf("guide %s shown on B, then again on the next connect (A's held copy went back to the inbox)", req.ID)
	}
}

// TestAttack29KeepAfterSecondConnectRefused: a reconnect while the user
// still has a connection here raises the count (1 to 2), so a keep that
// read the route before it is refused, and the push routes again. This
// path is safe; it passes.
func TestAttack29KeepAfterSecondConnectRefused(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	uid := "a29-second"
	tg.dial(t, uid)
	tg.a29WaitCount(t, uid, "1")
	routes, err := tg.rdb.HGetAll(ctx, tg.store.Keyspace().RouteKey(uid)).Result()
	if err != nil {
		t.Fatal(err)
	}
	tg.dial(t, uid)
	tg.a29WaitCount(t, uid, "2")
	req := push.Request{ID: "a29-second-1", UID: uid, Text: "Still there?"}
	payload, _ := json.Marshal(req)
	status, err := tg.keep(ctx, req, payload, routes, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if status != "" {
		t.Errorf("keep with the route read at count 1, now 2: %q, want refused (route again)", status)
	}
	if n := tg.a29Inbox(t, uid); n != 0 {
		t.Errorf("inbox holds %d entries, want none", n)
	}
}
