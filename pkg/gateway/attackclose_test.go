package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// These tests attack the close decided once (session.Store.CommitClose):
// the first connection about to write a close stage's guide decides, by
// the user's renewed key, whether its close is applied or cancelled, and
// every other connection follows.

// aclDecision is what the commit decided for uid's close stage guide id
// ("applied", "cancelled"), or "" (undecided, or a gateway that does not
// decide): read by pattern, the key's name being the store's own.
func aclDecision(t *testing.T, tg *testGateway, uid, id string) string {
	t.Helper()
	ctx := context.Background()
	keys, err := tg.rdb.Keys(ctx, "*pc:"+uid+"/"+id).Result()
	if err != nil || len(keys) != 1 {
		return ""
	}
	return tg.rdb.Get(ctx, keys[0]).Val()
}

// TestAttackCloseRoutedCancelledByAwayReconnect: a user's one device is on
// instance B, and got the silence's reminder on time. Instance A claims
// the close stage and routes it to B, which reads it off its channel
// more than half a second later (a paused process). Meanwhile the user's
// other device reconnects on A after a network drop, its client saying in
// its first ping that the user has been away for 70 s; that ping renews
// the session after the deadline, as any first ping does. The user never
// came back. B's connection is the first about to write the close: the
// commit finds the renewal after the deadline and cancels it, and the
// close is written nowhere, as it would be found stale had its push been
// claimed after that ping (a first ping renews the session, which makes
// every later stage of the silence stale: see present.go). The session
// goes on from that renewal, and a silence after it is guided, reminder
// and close. What must not happen is half of it: B's device closed and
// A's not, or the close written once cancelled.
func TestAttackCloseRoutedCancelledByAwayReconnect(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ctx := context.Background()
	uid := "aclaway-" + newToken()[:8]
	onB := b.dial(t, uid)
	pingPong(t, onB)
	deadline := aaloneSilenceRanOut(t, b, uid)
	aaloneRouteNames(t, a, uid, b.instance, "")

	claimed := redisNowMS(t, a.rdb)
	remind, closing := arSilence(uid, deadline, claimed)
	// The reminder goes out on time, on B.
	b.readRouted(t, remind)
	readGuide(t, onB, remind.ID)
	// A claims the close stage and publishes it to B (settled
	// delivered: B's subscriber took it off the channel).
	tok := newToken()
	if state, err := a.store.ClaimPush(ctx, uid, closing.ID, tok, claimTTL, deadline); err != nil || state != session.PushFresh {
		t.Fatalf("A's claim of the close stage: %q, %v", state, err)
	}
	if err := a.store.SettlePush(ctx, uid, closing.ID, tok, string(push.Delivered), pushedTTL); err != nil {
		t.Fatal(err)
	}

	// The other device reconnects on A while B is paused, saying the
	// user has been away since before the deadline.
	onA := a.dialFirstPing(t, uid)
	pingSaying(t, onA, arAwayAgoMS)
	readPong(t, onA)
	arRenewedAfter(t, a, uid, deadline)
	arClockPast(t, b.rdb, claimed+2*recheckAge.Milliseconds())

	b.readRouted(t, closing)
	if d := aclDecision(t, b, uid, closing.ID); d != "cancelled" {
		t.Fatalf("the close's decision: %q; want cancelled, by the first ping's renewal after the deadline", d)
	}
	// Written nowhere: the next frame of each device is its pong.
	pingPong(t, onB)
	pingPong(t, onA)
}

// TestAttackCloseInboxShownThenCancelled: a user's laptop reconnects after
// a network drop (first=ping) and holds its guides until its first ping.
// The silence's close stage is pushed (its reminder went out before, kept
// in the inbox): the laptop holds it, and the push keeps it in the inbox
// ahead of its delivery. The user's phone connects meanwhile, and is
// handed the inbox: the reminder, then the close stage ("your chat was
// closed"), which it shows. No connection committed the close: an inbox
// handover takes no part in the decision. The user then pings on the
// phone (they are back). The laptop's first ping comes more than half a
// second after the push: it is the first connection about to write the
// close live, and the commit cancels it. The phone showed the chat closed;
// the laptop's chat stays open, the same close cancelled there.
func TestAttackCloseInboxShownThenCancelled(t *testing.T) {
	tg := startGateway(t, nil)
	uid := "aclinbox-" + newToken()[:8]
	deadline := redisNowMS(t, tg.rdb) - 1000
	remind, closing := arSilence(uid, deadline, 0)
	tg.mustPush(t, remind, push.Queued)

	laptop := tg.dialFirstPing(t, uid)
	tg.mustPush(t, closing, push.Delivered)
	pushed := redisNowMS(t, tg.rdb)

	phone := tg.dial(t, uid)
	readGuide(t, phone, remind.ID)
	readGuide(t, phone, closing.ID) // shown: "your chat was closed"
	// The phone proves both (its reads answer the proof pings), and the
	// user is back on it.
	pingPong(t, phone)
	arRenewedAfter(t, tg, uid, deadline)
	arClockPast(t, tg.rdb, pushed+2*recheckAge.Milliseconds())

	pingSaying(t, laptop, arAwayAgoMS)
	m := readJSON(t, laptop)
	if m["type"] == "guide" && m["id"] == remind.ID {
		m = readJSON(t, laptop)
	}
	if m["type"] != "guide" || m["id"] != closing.ID {
		t.Fatalf("the laptop got %v (the close's decision: %q); want the close stage %s: the phone was shown that close (from the inbox), and it is cancelled here, the laptop's chat left open", m, aclDecision(t, tg, uid, closing.ID), closing.ID)
	}
}

// TestAttackCloseReminderDecidesCloseRouteDropsIt: a user's one device is
// on instance B. Instance A claims the silence's reminder and routes it
// to B, which reads it late (a paused process). The consumer pushes the
// close stage to A, which claims it while the user is away and pauses
// before routing it. The user comes back through the platform. B judges
// its late reminder: the user came back, but the close stage is being
// pushed (claimed), so LaterStageGoes decides its close applied ("so that
// it goes out after this reminder") and the reminder goes out. A then
// resumes: its route judges the close stage again by the renewal, not by
// the decision, and answers stale. "Are you still there?" goes to a user
// who came back, and the close decided applied for it never follows.
func TestAttackCloseReminderDecidesCloseRouteDropsIt(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ctx := context.Background()
	uid := "acldecide-" + newToken()[:8]
	onB := b.dial(t, uid)
	pingPong(t, onB)
	deadline := aaloneSilenceRanOut(t, b, uid)
	aaloneRouteNames(t, a, uid, b.instance, "")

	claimed := redisNowMS(t, a.rdb)
	remind, closing := arSilence(uid, deadline, claimed)
	// A's push of the reminder: claimed, published to B, settled
	// delivered.
	tok := newToken()
	if state, err := a.store.ClaimPush(ctx, uid, remind.ID, tok, claimTTL, deadline); err != nil || state != session.PushFresh {
		t.Fatalf("A's claim of the reminder: %q, %v", state, err)
	}
	if err := a.store.SettlePush(ctx, uid, remind.ID, tok, string(push.Delivered), pushedTTL); err != nil {
		t.Fatal(err)
	}
	// A's push of the close stage: claimed, then paused before its route.
	closeTok := newToken()
	if state, err := a.store.ClaimPush(ctx, uid, closing.ID, closeTok, claimTTL, deadline); err != nil || state != session.PushFresh {
		t.Fatalf("A's claim of the close stage: %q, %v", state, err)
	}

	// The user comes back through the platform.
	if _, err := b.store.Renew(ctx, uid, "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	arRenewedAfter(t, b, uid, deadline)
	arClockPast(t, b.rdb, claimed+2*recheckAge.Milliseconds())

	// B reads the reminder late; then A's paused push resumes.
	b.readRouted(t, remind)
	res, err := a.route(ctx, closing)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.store.SettlePush(ctx, uid, closing.ID, closeTok, string(res.Status), pushedTTL); err != nil {
		t.Fatal(err)
	}

	pingSaying(t, onB, -1)
	m := readJSON(t, onB)
	if m["type"] == "pong" {
		return // neither stage: the user came back
	}
	if m["type"] != "guide" || m["id"] != remind.ID {
		t.Fatalf("B's device got %v; want the reminder %s and its close, or neither", m, remind.ID)
	}
	if m := readJSON(t, onB); m["type"] != "guide" || m["id"] != closing.ID {
		t.Fatalf("B's device got %v after the reminder %s; want its close stage %s: the reminder went to a user who came back because its close was decided applied, and A's route then answered %q for that close", m, remind.ID, closing.ID, res.Status)
	}
}

// TestAttackCloseFailedCommitThenCancelled: a user's devices are on
// instances A and B. The close stage is routed to both (by a third
// instance that holds no connection of the user). B reads it first while
// Redis holds writes (a graceful failover pauses them): its commit fails.
// Had that written the close (B's device closed) without a decision,
// A's connection, reading its copy late after the user came back through
// the platform, would be the first to commit, and cancel it: one device's
// chat closed, the other's open for the same close. A failed commit
// writes nothing, and the first commit that succeeds decides for both.
func TestAttackCloseFailedCommitThenCancelled(t *testing.T) {
	srv := redistest.Start(t)
	addrs, prefix := []string{srv.Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ctx := context.Background()
	uid := "aclfail-" + newToken()[:8]
	onA, onB := a.dial(t, uid), b.dial(t, uid)
	pingPong(t, onA)
	pingPong(t, onB)
	deadline := aaloneSilenceRanOut(t, b, uid)
	claimed := redisNowMS(t, b.rdb)
	_, closing := arSilence(uid, deadline, claimed)

	// Redis holds every write (scripts included) until unpaused below;
	// the bound only ends the pause should the test fail first.
	if err := b.rdb.Do(ctx, "CLIENT", "PAUSE", 60_000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			if err := a.rdb.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(unpause)
	b.readRouted(t, closing) // its commit fails once its call times out
	unpause()

	if _, err := a.store.Renew(ctx, uid, "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	arRenewedAfter(t, a, uid, deadline)
	arClockPast(t, a.rdb, claimed+2*recheckAge.Milliseconds())

	a.readRouted(t, closing)
	if d := aclDecision(t, a, uid, closing.ID); d != "cancelled" {
		t.Fatalf("the close's decision: %q; want cancelled, by A's commit after the user came back", d)
	}
	// Neither device was written it: the next frame of each is its pong.
	pingPong(t, onB)
	pingPong(t, onA)
}
