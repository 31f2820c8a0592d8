package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// al3CloseFoundOver pushes a silence's close stage on g as push does, with
// the gateway paused between its claim and its route: claimed while the
// user is away, it is routed only after the user came back through the
// platform (a renewal after the deadline) and more than recheckAge after
// its claim, so route judges it again, answers stale, and the push
// settles its claim so. It returns when the push has settled.
func al3CloseFoundOver(t *testing.T, g *testGateway, closing push.Request) {
	t.Helper()
	ctx := context.Background()
	tok := newToken()
	closing.CheckedMS = redisNowMS(t, g.rdb)
	if state, err := g.store.ClaimPush(ctx, closing.UID, closing.ID, tok, claimTTL, closing.DeadlineMS); err != nil || state != session.PushFresh {
		t.Fatalf("the close stage's claim: %q, %v", state, err)
	}
	// The user comes back (another device, the platform) while the push
	// is paused: after the deadline, by Redis's clock.
	arClockPast(t, g.rdb, closing.DeadlineMS)
	if _, err := g.store.Renew(ctx, closing.UID, "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	arRenewedAfter(t, g, closing.UID, closing.DeadlineMS)
	// Real time must pass: the push resumes more than recheckAge after
	// its claim.
	arClockPast(t, g.rdb, closing.CheckedMS+2*recheckAge.Milliseconds())
	res, err := g.route(ctx, closing)
	if err != nil || res.Status != push.Stale {
		t.Fatalf("the paused close stage's route: %+v, %v; want stale (the user came back)", res, err)
	}
	if err := g.store.SettlePush(ctx, closing.UID, closing.ID, tok, string(res.Status), pushedTTL); err != nil {
		t.Fatal(err)
	}
}

// TestAttackLate3RoutedReminderAfterStaleClose: a user's device is on
// instance B. Instance A claims a silence's reminder and routes it to B,
// which reads it off its channel late (a paused process). The close stage
// is claimed on A while the user is still away, but A pauses before
// routing it; the user comes back meanwhile (a renewal after the
// deadline), and A's route judges the close again and answers stale: no
// device is ever told the chat closed, and the consumer marks the
// silence's later stages stale. B then judges its late reminder: the user
// came back, but LaterStageClaimed finds the close stage's key (settled
// "stale", not claimed for delivery) and sends "are you still there?" to
// a user who came back, though no close stage follows it. The change's
// reason to send a late reminder (its close goes to the devices, and must
// not come first) does not hold: the guide goes to someone present.
func TestAttackLate3RoutedReminderAfterStaleClose(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ctx := context.Background()
	uid := "al3routed-" + newToken()[:8]
	onB := b.dial(t, uid)
	pingPong(t, onB)
	arRenewedAfter(t, b, uid, 0)
	renewed, err := b.store.LastRenewed(ctx, uid)
	if err != nil {
		t.Fatal(err)
	}
	deadline := renewed.UnixMilli() + 1
	arClockPast(t, b.rdb, deadline)
	claimed := redisNowMS(t, a.rdb)
	remind, closing := arSilence(uid, deadline, claimed)
	// A's push of the reminder: claimed, published to B (which takes it
	// off the channel late, below), settled delivered.
	tok := newToken()
	if state, err := a.store.ClaimPush(ctx, uid, remind.ID, tok, claimTTL, deadline); err != nil || state != session.PushFresh {
		t.Fatalf("A's claim of the reminder: %q, %v", state, err)
	}
	if err := a.store.SettlePush(ctx, uid, remind.ID, tok, string(push.Delivered), pushedTTL); err != nil {
		t.Fatal(err)
	}
	// The consumer then pushes the close stage, to A, which pauses.
	al3CloseFoundOver(t, a, closing)

	b.readRouted(t, remind)
	// The next frame is the pong: no reminder to a user who came back,
	// whose chat is never closed.
	pingSaying(t, onB, -1)
	if m := readJSON(t, onB); m["type"] != "pong" {
		t.Fatalf("B's device got %v; want no guide: the user came back and the close stage was found stale, so no close follows this reminder", m)
	}
}

// TestAttackLate3HeldReminderAfterStaleClose: the hold path of the same
// defect. A device reconnects after a network drop (first=ping) and holds
// its guides; a silence's reminder is pushed and held. The close stage is
// claimed while the user is away, its gateway pauses before routing it,
// the user comes back through the platform, and the route answers stale:
// the chat is never closed. The device's first ping comes late (its client
// has not seen the user: away 70 s); the held reminder is judged again,
// found over, but goes out as the close stage's key exists.
func TestAttackLate3HeldReminderAfterStaleClose(t *testing.T) {
	tg := startGateway(t, nil)
	uid := "al3hold-" + newToken()[:8]
	ws := tg.dialFirstPing(t, uid)
	deadline := redisNowMS(t, tg.rdb) - 1000
	remind, closing := arSilence(uid, deadline, 0)
	tg.mustPush(t, remind, push.Delivered)
	al3CloseFoundOver(t, tg, closing)

	pingSaying(t, ws, arAwayAgoMS)
	if m := readJSON(t, ws); m["type"] != "pong" {
		t.Fatalf("the held device got %v first; want the pong and no guide: the user came back through the platform and the close stage was found stale, so no close follows this reminder", m)
	}
}
