package gateway

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
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
// late close stage routed in, whose close may be applied elsewhere.
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
		want     push.Status // resumed only
		sent     bool
	}{
		{name: "routed in, user back", arrive: routedIn, cameBack: true},
		{name: "routed in, user away", arrive: routedIn, sent: true},
		{name: "routed in, close stage of a user back", arrive: routedIn, final: true, cameBack: true, sent: true},
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
