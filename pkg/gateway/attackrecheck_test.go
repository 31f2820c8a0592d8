package gateway

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// arAwayAgoMS is what a reconnecting client says of its user in its first
// ping: last active 70 s ago, long before the silences below ran out (the
// test TTL is 10 s), so nothing is superseded by the word.
const arAwayAgoMS = 70_000

// arSilence is one silence's reminder and close stage, claimed at
// checkedMS, under the ids the listener gives them.
func arSilence(uid string, deadline, checkedMS int64) (remind, closing push.Request) {
	remind = push.Request{ID: timeoutevent.StageID(uid, deadline, 1), UID: uid, Text: "Still there?", DeadlineMS: deadline, DueMS: deadline, Stage: 1, CheckedMS: checkedMS}
	closing = push.Request{ID: timeoutevent.StageID(uid, deadline, 2), UID: uid, Text: "Closed.", DeadlineMS: deadline, DueMS: deadline, Stage: 2,
		Action: timeoutevent.ActionClose, Final: true, Reason: timeoutevent.ReasonOf(timeoutevent.ActionClose), CheckedMS: checkedMS}
	return remind, closing
}

// arRenewedAfter waits until uid's renewed key says a renewal after ms.
func arRenewedAfter(t *testing.T, tg *testGateway, uid string, ms int64) {
	t.Helper()
	waitUntil(t, "a renewal after the deadline", func() bool {
		at, err := tg.store.LastRenewed(context.Background(), uid)
		return err == nil && at.UnixMilli() > ms
	})
}

// arClockPast waits until Redis's clock is past ms. Real time must pass:
// the guides must be older than recheckAge when a connection takes them.
func arClockPast(t *testing.T, rdb redis.UniversalClient, ms int64) {
	t.Helper()
	waitUntil(t, "Redis's clock past the recheck age", func() bool { return redisNowMS(t, rdb) > ms })
}

// TestAttackRecheckHeldCloseWithoutReminder: two devices of a user
// reconnect after a network drop (first=ping) and hold their guides; a
// silence's reminder and close stage are pushed to both. The first device
// pings first, its client saying the user has been away for 70 s: it is
// shown the reminder, then the close. That ping renews the session, after
// the deadline, as any first ping does. The second device's first ping
// comes more than half a second after the pushes: its held reminder is
// judged again and dropped as came_back (the user did not come back: the
// renewal is the other device's reconnect, whose client said the user was
// away), while its held close stage is not judged and goes out. The
// second device shows "chat closed" without ever having shown "are you
// still there?": disordered, the reminder lost on that device.
func TestAttackRecheckHeldCloseWithoutReminder(t *testing.T) {
	tg := startGateway(t, nil)
	uid := "arhold-" + newToken()[:8]
	first := tg.dialFirstPing(t, uid)
	second := tg.dialFirstPing(t, uid)
	waitUntil(t, "both connections in the hub", func() bool { return len(tg.hub.lookup(uid)) == 2 })
	deadline := redisNowMS(t, tg.rdb) - 1000
	// Pushed for real: each push stamps its own claim's judgement.
	remind, closing := arSilence(uid, deadline, 0)
	tg.mustPush(t, remind, push.Delivered)
	tg.mustPush(t, closing, push.Delivered)
	claimed := redisNowMS(t, tg.rdb)

	pingSaying(t, first, arAwayAgoMS)
	readGuide(t, first, remind.ID)
	readGuide(t, first, closing.ID)
	// The first device's ping renews the session after the deadline.
	arRenewedAfter(t, tg, uid, deadline)
	arClockPast(t, tg.rdb, claimed+2*recheckAge.Milliseconds())

	pingSaying(t, second, arAwayAgoMS)
	m := readJSON(t, second)
	if m["type"] != "guide" || m["id"] != remind.ID {
		t.Fatalf("the second device's first frame after its hold is %v; want the reminder %s before the close stage %s (the user never came back: the renewal is the other device's reconnect)", m, remind.ID, closing.ID)
	}
	readGuide(t, second, closing.ID)
}

// TestAttackRecheckRoutedCloseWithoutReminder: a user's device is on
// instance B. Instance A claimed a silence's reminder and close stage and
// routed both to B, which reads them off its channel more than half a
// second later (a paused process). Meanwhile the user's other device
// reconnected on A, its first ping saying the user has been away for 70 s;
// that ping renews the session after the deadline. B judges the routed
// reminder again and drops it as came_back, but not the close stage: the
// device on B is closed without its reminder, though the user never came
// back.
func TestAttackRecheckRoutedCloseWithoutReminder(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ctx := context.Background()
	uid := "arrouted-" + newToken()[:8]
	onB := b.dial(t, uid)
	pingPong(t, onB)
	arRenewedAfter(t, b, uid, 0)
	renewed, err := b.store.LastRenewed(ctx, uid)
	if err != nil {
		t.Fatal(err)
	}
	// The silence ran out after that ping (a short one, for the test),
	// and A claimed both stages once it had.
	deadline := renewed.UnixMilli() + 1
	arClockPast(t, b.rdb, deadline)
	claimed := redisNowMS(t, b.rdb)
	remind, closing := arSilence(uid, deadline, claimed)
	for _, req := range []push.Request{remind, closing} {
		if state, err := a.store.ClaimPush(ctx, uid, req.ID, newToken(), claimTTL, deadline); err != nil || state != session.PushFresh {
			t.Fatalf("A's claim of %s: %q, %v", req.ID, state, err)
		}
	}

	// The other device reconnects on A, saying the user has been away.
	onA := a.dialFirstPing(t, uid)
	pingSaying(t, onA, arAwayAgoMS)
	readPong(t, onA)
	arRenewedAfter(t, a, uid, deadline)
	arClockPast(t, b.rdb, claimed+2*recheckAge.Milliseconds())

	// B reads what A published, in the order A published it.
	b.readRouted(t, remind, closing)
	m := readJSON(t, onB)
	if m["type"] != "guide" || m["id"] != remind.ID {
		t.Fatalf("B's device got %v first; want the reminder %s before the close stage %s (the user never came back: the renewal is the other device's reconnect)", m, remind.ID, closing.ID)
	}
	readGuide(t, onB, closing.ID)
}
