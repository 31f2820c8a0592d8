package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on the route written again at a renewal that finds Redis
// knowing nothing of its user, and on the close handed to a device open
// before it.

// arNoRefresh puts the minute's route refresh out of the tests' reach:
// they are about what heals a lost route before it (a refresh of the
// user's hub shard may otherwise fall in a test's wait, by chance).
func arNoRefresh(c *Config) { c.routeRefreshEvery = time.Hour }

// arAfterStartEcho waits out the re-registration of every user that a
// new instance's heartbeat makes a lease after its first (the echo),
// which would write a lost route again by chance. Real time must pass:
// nothing tells that it is done.
func arAfterStartEcho(gs ...*testGateway) {
	var wait time.Duration
	for _, g := range gs {
		wait = max(wait, 3*g.lease()+2*g.cfg.HeartbeatInterval)
	}
	time.Sleep(wait)
}

// TestAttackRouteLostOnTwoInstancesOnlyFirstRewrites: the user is
// connected on two instances, A (laptop) and B (phone), and Redis loses
// their keys (a node restarted without its data). Only the first renewal
// after the loss finds Redis knowing nothing of the user: it writes the
// renewed key, so the other instance's renewals find it known and never
// write their route entry again. The route then names A only; the
// laptop's normal close finds no connection of the user left anywhere
// and ends the session of the phone, still connected on B: its silence
// is never guided.
func TestAttackRouteLostOnTwoInstancesOnlyFirstRewrites(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, arNoRefresh)
	b := startGatewayOn(t, addrs, prefix, arNoRefresh)
	ctx := context.Background()
	ks := a.store.Keyspace()
	uid := "ar-two"
	laptop := a.dial(t, uid)
	phone := b.dial(t, uid)
	pingPong(t, laptop)
	pingPong(t, phone)
	waitUntil(t, "both instances in the route", func() bool {
		return len(a.rdb.HGetAll(ctx, ks.RouteKey(uid)).Val()) == 2
	})
	arAfterStartEcho(a, b)
	// The user's keys go, as on a node restarted empty.
	if err := a.rdb.Del(ctx, ks.RouteKey(uid), ks.RenewedKey(uid), ks.SessionKey(uid)).Err(); err != nil {
		t.Fatal(err)
	}
	pingPong(t, laptop)
	waitUntil(t, "A's route entry written again", func() bool {
		return a.rdb.HExists(ctx, ks.RouteKey(uid), a.instance).Val()
	})
	pingPong(t, phone)
	// B's renewal, like A's, follows a loss of its route entry; give a
	// rewrite it may start time to land before the laptop leaves.
	bBack := waitFor(5*time.Second, func() bool { return a.rdb.HExists(ctx, ks.RouteKey(uid), b.instance).Val() })

	closeNormally(laptop)
	waitUntil(t, "the laptop is counted out", func() bool {
		return a.hub.count(uid) == 0 && !a.rdb.HExists(ctx, ks.RouteKey(uid), a.instance).Val()
	})
	if !sessionExists(a, uid) {
		t.Errorf("the laptop's normal close ended the session of the phone connected on B (B's route entry written again after the loss: %v): "+
			"only the first renewal after the loss found Redis knowing nothing of the user, and B's ping never wrote B's entry again", bBack)
	}
}

// arClosedMS is the closed_ms of uid's inbox entry for id (0: none).
func (tg *testGateway) arClosedMS(t *testing.T, uid, id string) int64 {
	t.Helper()
	for _, raw := range tg.rdb.LRange(context.Background(), tg.store.Keyspace().InboxKey(uid), 0, -1).Val() {
		var e struct {
			ID       string `json:"id"`
			ClosedMS int64  `json:"closed_ms"`
		}
		json.Unmarshal([]byte(raw), &e)
		if e.ID == id {
			return e.ClosedMS
		}
	}
	return 0
}

// TestAttackRouteCloseInOpeningSecondLost: the fifth round's held close
// leased elsewhere (TestAttackAhead5HeldCloseLeasedElsewhereLost), with
// the close kept in the same second as the holding device H opened. H was
// open before the close, and was never told; but its opening is rounded
// up to the end of its second (openedMS), so a close kept within that
// second is judged applied after H opened, and H's own first ping's
// renewal makes it stale again: the close is told on no device.
func TestAttackRouteCloseInOpeningSecondLost(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.firstPingWaitFor = time.Minute })
	for attempt := 0; attempt < 4; attempt++ {
		uid := fmt.Sprintf("ar-second-%d", attempt)
		// Start at the beginning of a second, so that H's open and the
		// close's keep can fall in one (real time must pass for that).
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 5*time.Millisecond)))
		wsH := tg.dialFirstPing(t, uid)
		var opened int64
		for _, c := range tg.hub.lookup(uid) {
			opened = c.openedMS / 1000
		}
		wsB := tg.dial(t, uid)
		c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
		if res := tg.mustPush(t, c, push.Delivered); res.Connections != 2 {
			t.Fatalf("delivered to %d connections, want 2", res.Connections)
		}
		readStage(t, wsB, c)
		wsB.NetConn().Close()
		waitUntil(t, "B's applied close stage kept closed", func() bool {
			return tg.hub.count(uid) == 1 && slices.Equal(tg.aaInboxIDs(t, uid), []string{c.ID + "(closed)"})
		})
		closed := tg.arClosedMS(t, uid, c.ID)
		if closed/1000 != opened {
			t.Logf("attempt %d: H opened in second %d, the close kept at %d ms: not one second, again", attempt, opened, closed)
			wsH.Close()
			continue
		}
		wsB2 := tg.dial(t, uid)
		waitUntil(t, "c leased to B2's handover", func() bool { return tg.aaLeases(uid) == 1 })
		pingSaying(t, wsH, 0)
		got := aa5Frames(t, wsH)
		for _, id := range got {
			aaAck(t, wsH, id)
		}
		wsB2.NetConn().Close()
		// B2's lease is released when it ends, unless H holds the entry
		// by then (told).
		waitUntil(t, "B2 ends", func() bool { return tg.hub.count(uid) == 1 })
		got = append(got, aa5ReadFor(t, wsH, 3*time.Second)...)
		if slices.Contains(got, c.ID) {
			return
		}
		inbox := tg.aaInboxIDs(t, uid)
		next := aaGuidesBeforePong(t, tg.dial(t, uid))
		if !slices.Contains(next, c.ID) {
			t.Errorf("H opened at second %d, before the close kept at %d ms, was handed %v; the inbox held %v, and the next connect was handed %v: the close stage is lost. H's opening, rounded up to the end of its second, was judged after the close, and H's own first ping made the closed entry stale", opened, closed, got, inbox, next)
		}
		return
	}
	t.Skip("the close never fell in H's opening second")
}

// TestAttackRouteLostActivityFirstNeverWritten: after Redis loses the
// user's keys, the first to reach them is the chat platform's activity
// report of the user's message (their session renewed through the
// activity endpoint), not the user's ping. It records a renewal, so the
// ping that follows finds Redis knowing the user and writes no route:
// a push through another instance finds the user connected nowhere and
// keeps the guide until the minute's refresh.
func TestAttackRouteLostActivityFirstNeverWritten(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	withActivity := func(c *Config) { c.ActivitySecret = activitySecret; arNoRefresh(c) }
	a := startGatewayOn(t, addrs, prefix, withActivity)
	b := startGatewayOn(t, addrs, prefix, withActivity)
	ctx := context.Background()
	ks := a.store.Keyspace()
	uid := "ar-activity"
	ws := a.dial(t, uid)
	pingPong(t, ws)
	arAfterStartEcho(a, b)
	if err := a.rdb.Del(ctx, ks.RouteKey(uid), ks.RenewedKey(uid), ks.SessionKey(uid)).Err(); err != nil {
		t.Fatal(err)
	}
	// The user writes a message; the platform reports it.
	if w := postActivity(a.activity, events(fmt.Sprintf(`{"uid":%q,"kind":"active"}`, uid)), nil); w.Code != 200 {
		t.Fatalf("activity post: %d %s", w.Code, w.Body)
	}
	if !sessionExists(a, uid) {
		t.Fatal("the activity report did not renew the session")
	}
	pingPong(t, ws)
	// A rewrite the ping starts lands within this.
	written := waitFor(5*time.Second, func() bool { return a.rdb.Exists(ctx, ks.RouteKey(uid)).Val() == 1 })
	code, out := b.push(t, pushSecret, map[string]string{"id": "ara1", "uid": uid, "text": "Are you still there?"})
	if code != 200 || out["status"] != "delivered" {
		t.Fatalf("push via the other instance: %d %v (route written again: %v), want delivered to the user's connection on A: "+
			"the activity report renewed first after the loss, so the user's ping found Redis knowing them and their route was never written again", code, out, written)
	}
}
