package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// readRouted hands tg guides another instance routed here, in order, as
// its channel's reader does when it reads them (late, after a pause).
func (tg *testGateway) readRouted(t *testing.T, reqs ...push.Request) {
	t.Helper()
	for _, req := range reqs {
		raw, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		tg.routedIn(context.Background(), string(raw))
	}
}

// TestLateGuideJudgedAgain: a guide whose silence was last judged (its
// push's claim) longer than recheckAge ago is judged again before a
// connection takes it. A gateway paused between a push's claim and its
// delivery, or one that reads a routed guide off its channel only after a
// pause, would otherwise hand "Are you still there?" to a user who came
// back meanwhile on another device or through the platform (the fault
// suite found one: act-052, guided 1.3 s after its activity landed). A
// guide whose user did not come back goes out as before, and so does a
// late close stage routed in whose close was applied elsewhere first; one
// no connection wrote before the user came back goes out nowhere.
func TestLateGuideJudgedAgain(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	type arrival func(t *testing.T, req push.Request) push.Status
	// routedIn: another instance claimed it and routed it here.
	routedIn := func(t *testing.T, req push.Request) push.Status {
		tg.readRouted(t, req)
		return ""
	}
	// resumed: this instance's push resumes between its claim and its
	// route.
	resumed := func(t *testing.T, req push.Request) push.Status {
		res, err := tg.route(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return res.Status
	}
	for _, tc := range []struct {
		name     string
		arrive   arrival
		final    bool
		cameBack bool
		later    bool        // a later stage of its silence was claimed before the user came back
		applied  bool        // a close stage another connection wrote before the user came back
		want     push.Status // resumed only
		sent     bool
	}{
		{name: "routed in, user back", arrive: routedIn, cameBack: true},
		{name: "routed in, user away", arrive: routedIn, sent: true},
		// No connection wrote it before the user came back: written
		// nowhere (the fault suite's act-052, a close routed to a paused
		// gateway, read 1.3 s after the user's activity landed).
		{name: "routed in, close stage of a user back", arrive: routedIn, final: true, cameBack: true},
		// Another connection wrote it, and closed: this one is told too.
		{name: "routed in, close stage applied before the user came back", arrive: routedIn, final: true, cameBack: true, applied: true, sent: true},
		{name: "routed in, close stage of a user away", arrive: routedIn, final: true, sent: true},
		// Its close stage goes out to the devices: not without it.
		{name: "routed in, user back after its close stage was claimed", arrive: routedIn, cameBack: true, later: true, sent: true},
		{name: "resumed, user back after its close stage was claimed", arrive: resumed, cameBack: true, later: true, want: push.Stale},
		{name: "resumed, user back", arrive: resumed, cameBack: true, want: push.Stale},
		{name: "resumed, close stage of a user back", arrive: resumed, final: true, cameBack: true, want: push.Stale},
		{name: "resumed, user away", arrive: resumed, want: push.Delivered, sent: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := "late-" + newToken()[:8]
			ws := tg.dial(t, uid)
			pingPong(t, ws)
			var renewed time.Time
			waitUntil(t, "the ping's renewal", func() bool {
				at, err := tg.store.LastRenewed(ctx, uid)
				renewed = at
				return err == nil && !at.IsZero()
			})
			// The silence ran out a millisecond after the ping's renewal
			// (a short one, for the test), and is past; the guide's claim
			// judged it 2 s ago.
			deadline := renewed.UnixMilli() + 1
			waitUntil(t, "Redis's clock past the deadline", func() bool { return redisNowMS(t, tg.rdb) > deadline })
			now := redisNowMS(t, tg.rdb)
			req := push.Request{ID: "g-" + uid, UID: uid, Text: "still there?", DeadlineMS: deadline, DueMS: deadline, Stage: 1, CheckedMS: now - 2000}
			if tc.final {
				req.Stage, req.Action, req.Final, req.Reason = 2, timeoutevent.ActionClose, true, timeoutevent.ReasonOf(timeoutevent.ActionClose)
			}
			if tc.later {
				id := timeoutevent.StageID(uid, req.DeadlineMS, 2)
				if _, err := tg.store.ClaimPush(ctx, uid, id, newToken(), claimTTL, req.DeadlineMS); err != nil {
					t.Fatal(err)
				}
			}
			if tc.applied {
				if ok, err := tg.store.CommitClose(ctx, uid, req.ID, req.DeadlineMS, time.Minute); err != nil || !ok {
					t.Fatalf("commit close: applied %v, %v", ok, err)
				}
			}
			if tc.cameBack {
				// On another device, or through the platform: after the
				// deadline, by Redis's clock.
				waitUntil(t, "Redis's clock past the deadline", func() bool { return redisNowMS(t, tg.rdb) > req.DeadlineMS })
				if _, err := tg.store.Renew(ctx, uid, "default", time.Minute, session.ClockPresence); err != nil {
					t.Fatal(err)
				}
			}
			got := tc.arrive(t, req)
			if tc.want != "" && got != tc.want {
				t.Errorf("push answered %q, want %q", got, tc.want)
			}
			if tc.sent {
				readGuide(t, ws, req.ID)
				return
			}
			// The next frame is the pong: no guide came before it.
			pingPong(t, ws)
			waitUntil(t, "its entry out of the inbox", func() bool {
				return tg.rdb.LLen(ctx, tg.store.Keyspace().InboxKey(uid)).Val() == 0
			})
		})
	}
}

// TestCloseDecidedOnce: a close stage's close is decided by the first
// connection about to write it, on any instance, and every other follows.
//
//   - routed alone, read late: the fault suite's act-052. Instance A
//     claims the close stage of a silence whose reminder the user's one
//     device, on B, already got, and routes it to B alone; B is paused
//     and reads it 1.3 s after the user came back through the platform.
//     No connection wrote it before: it is written nowhere, and the
//     device stays connected.
//   - held: the user's device reconnects on B, holding its guides until
//     its first ping; the close stage is pushed to it and held. The user
//     comes back through the platform before that ping: the close is
//     written nowhere.
//   - applied first: the user's devices are on A and B; A's device gets
//     the close (its connection applies it, and closes), and then the
//     user comes back. B reads its copy late: it writes it, as the chat
//     is closed, and its device is told.
func TestCloseDecidedOnce(t *testing.T) {
	ctx := context.Background()
	setUp := func(t *testing.T) (a, b *testGateway) {
		addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
		return startGatewayOn(t, addrs, prefix, nil), startGatewayOn(t, addrs, prefix, nil)
	}
	comeBack := func(t *testing.T, tg *testGateway, uid string, deadline, claimed int64) {
		t.Helper()
		if _, err := tg.store.Renew(ctx, uid, "default", time.Minute, session.ClockPresence); err != nil {
			t.Fatal(err)
		}
		arRenewedAfter(t, tg, uid, deadline)
		arClockPast(t, tg.rdb, claimed+2*recheckAge.Milliseconds())
	}
	noGuide := func(t *testing.T, tg *testGateway, ws *websocket.Conn, uid string) {
		t.Helper()
		pingPong(t, ws) // the next frame is the pong: no guide, no close
		waitUntil(t, "the close's entry out of the inbox", func() bool {
			return tg.rdb.LLen(ctx, tg.store.Keyspace().InboxKey(uid)).Val() == 0
		})
	}

	t.Run("routed alone, read late", func(t *testing.T) {
		a, b := setUp(t)
		uid := "cdo-routed-" + newToken()[:8]
		onB := b.dial(t, uid)
		pingPong(t, onB)
		deadline := aaloneSilenceRanOut(t, b, uid)
		aaloneRouteNames(t, a, uid, b.instance, "")
		claimed := redisNowMS(t, a.rdb)
		_, closing := arSilence(uid, deadline, claimed)
		comeBack(t, b, uid, deadline, claimed)
		b.readRouted(t, closing)
		noGuide(t, b, onB, uid)
	})

	t.Run("held", func(t *testing.T) {
		_, b := setUp(t)
		uid := "cdo-held-" + newToken()[:8]
		ws := b.dialFirstPing(t, uid)
		deadline := redisNowMS(t, b.rdb) - 1000
		_, closing := arSilence(uid, deadline, 0)
		b.mustPush(t, closing, push.Delivered)
		comeBack(t, b, uid, deadline, redisNowMS(t, b.rdb))
		pingSaying(t, ws, arAwayAgoMS)
		readPong(t, ws)
		noGuide(t, b, ws, uid)
	})

	t.Run("applied first", func(t *testing.T) {
		a, b := setUp(t)
		uid := "cdo-applied-" + newToken()[:8]
		onA, onB := a.dial(t, uid), b.dial(t, uid)
		pingPong(t, onA)
		pingPong(t, onB)
		deadline := aaloneSilenceRanOut(t, a, uid)
		claimed := redisNowMS(t, a.rdb)
		_, closing := arSilence(uid, deadline, claimed)
		// A's own connection takes it first; B's copy is still on its way.
		if n, _, cancelled, _ := a.deliverLocal(ctx, closing); n != 1 || cancelled {
			t.Fatalf("A's connection: taken %d, cancelled %v", n, cancelled)
		}
		readGuide(t, onA, closing.ID)
		aaloneReadClosed(t, onA)
		comeBack(t, b, uid, deadline, claimed)
		b.readRouted(t, closing)
		readGuide(t, onB, closing.ID)
	})
}

// TestPushWaitsForAPausedInstance: the user's devices are on instance A
// and on instance P, which has missed its heartbeats (a paused process:
// the pings of the device on P wait unread in it, and the user may be
// answering through it). A push of the user's guide to A is refused
// (409, retry: this user's, not the gateway failing), and nothing reaches
// A's device, until P's lease runs out:
// then P is dead, its route entry is dropped, and the guide goes to A's
// device. (Were P to resume first, its held pings would renew the session
// and the retried claim would find the guide stale.)
func TestPushWaitsForAPausedInstance(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	uid := "paused-" + newToken()[:8]
	ws := tg.dial(t, uid)
	pingPong(t, ws)
	deadline := aaloneSilenceRanOut(t, tg, uid)
	paused := "paused-instance-" + newToken()[:8]
	const lease = 3 * time.Second
	if _, err := tg.store.Heartbeat(ctx, paused, lease); err != nil {
		t.Fatal(err)
	}
	beat := redisNowMS(t, tg.rdb)
	if err := tg.rdb.HSet(ctx, tg.store.Keyspace().RouteKey(uid), paused, 1).Err(); err != nil {
		t.Fatal(err)
	}
	// P is subscribed to its channel, and reads nothing: what it is
	// routed waits in its socket, counted as taken.
	sub := tg.rdb.(*redis.Client).SSubscribe(ctx, tg.store.Keyspace().InstanceChannel(paused))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	// Real time must pass: P misses its heartbeats.
	arClockPast(t, tg.rdb, beat+(lease/2).Milliseconds()+100)
	req := push.Request{ID: "g-" + uid, UID: uid, Text: "Still there?", DeadlineMS: deadline, Stage: 1}
	got, err := tg.pushGuide(t, req)
	var pe *push.Error
	if !errors.As(err, &pe) || pe.Status != push.Retry || pe.Code != http.StatusConflict {
		t.Fatalf("push while an instance of the user's route missed its heartbeat: %+v, %v; want 409 retry (route %v)", got, err,
			tg.rdb.HGetAll(ctx, tg.store.Keyspace().RouteKey(uid)).Val())
	}
	// P's lease runs out, and its process is gone: dead, and the guide
	// goes to A's device.
	sub.Close()
	arClockPast(t, tg.rdb, beat+lease.Milliseconds()+100)
	var res push.Response
	waitUntil(t, "the push to go through once P is dead", func() bool {
		res, err = tg.pushGuide(t, req)
		return err == nil
	})
	if res.Status != push.Delivered || res.Connections != 1 {
		// (Duplicate, had the refused push delivered it.)
		t.Fatalf("push once P is dead: %+v; want delivered to A's one connection", res)
	}
	readGuide(t, ws, req.ID)
}
