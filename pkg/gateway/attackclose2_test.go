package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// These tests attack, together, the close decided once (a late reminder
// decides its claimed close applied: session.Store.LaterStageGoes) and
// the push that waits for a paused instance (routeAwake answers 503, and
// the claim is released for the consumer's retry).

// TestAttackClose2ReminderDecidedCloseRefusedThenStale: a user's one
// device is on instance B; the user's route also names instance P (a
// second device, on a gateway that is about to pause). A silence runs
// out. Instance A claims the reminder and routes it to B, which reads it
// late (a paused process). The consumer pushes the close stage to A,
// which claims it while the user is still away, and pauses before its
// route. The user comes back through the platform; P has meanwhile
// missed its heartbeats. B reads its late reminder: the user came back,
// but the close stage is claimed, so LaterStageGoes decides its close
// applied and the reminder goes out to B's device. A resumes: routeAwake
// finds P's heartbeat late and refuses the push (503), which releases the
// claim. The consumer retries; the retried claim judges the close stage
// by the renewal alone, not by the decision made for it, and answers
// stale. "Are you still there?" went to a user who came back because its
// close was to follow, and the close decided applied never follows.
func TestAttackClose2ReminderDecidedCloseRefusedThenStale(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ctx := context.Background()
	uid := "acl2retry-" + newToken()[:8]
	onB := b.dial(t, uid)
	pingPong(t, onB)
	deadline := aaloneSilenceRanOut(t, b, uid)
	aaloneRouteNames(t, a, uid, b.instance, "")

	// P: alive, with a connection of the user, and about to pause.
	paused := "paused-instance-" + newToken()[:8]
	const lease = 4 * time.Second
	if _, err := a.store.Heartbeat(ctx, paused, lease); err != nil {
		t.Fatal(err)
	}
	beat := redisNowMS(t, a.rdb)
	if err := a.rdb.HSet(ctx, a.store.Keyspace().RouteKey(uid), paused, 1).Err(); err != nil {
		t.Fatal(err)
	}

	claimed := redisNowMS(t, a.rdb)
	remind, closing := arSilence(uid, deadline, claimed)
	// A's push of the reminder: claimed, published to B, settled
	// delivered (B's subscriber took it off the channel, unread).
	tok := newToken()
	if state, err := a.store.ClaimPush(ctx, uid, remind.ID, tok, claimTTL, deadline); err != nil || state != session.PushFresh {
		t.Fatalf("A's claim of the reminder: %q, %v", state, err)
	}
	if err := a.store.SettlePush(ctx, uid, remind.ID, tok, string(push.Delivered), pushedTTL); err != nil {
		t.Fatal(err)
	}
	// A's push of the close stage: claimed while the user is away, then
	// paused before its route.
	closeTok := newToken()
	if state, err := a.store.ClaimPush(ctx, uid, closing.ID, closeTok, claimTTL, deadline); err != nil || state != session.PushFresh {
		t.Fatalf("A's claim of the close stage: %q, %v", state, err)
	}

	// The user comes back through the platform.
	if _, err := b.store.Renew(ctx, uid, "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	arRenewedAfter(t, b, uid, deadline)
	// Real time must pass: P misses its heartbeats (a beat and a half of
	// its lease), and the guides are older than recheckAge.
	arClockPast(t, a.rdb, max(beat+(lease/2).Milliseconds()+100, claimed+2*recheckAge.Milliseconds()))

	// B reads the reminder late: it goes out, its close decided applied.
	b.readRouted(t, remind)
	decided := aclDecision(t, b, uid, closing.ID)

	// A resumes, and settles as its push does: a route that failed
	// releases the claim, for the consumer's retry.
	res, err := a.route(ctx, closing)
	outcome := ""
	if err == nil {
		outcome = string(res.Status)
	}
	if serr := a.store.SettlePush(ctx, uid, closing.ID, closeTok, outcome, pushedTTL); serr != nil {
		t.Fatal(serr)
	}
	if err != nil {
		t.Logf("A's route of the close stage: %v (the claim released; the consumer retries)", err)
		// The consumer retries until the push settles: P answers, or
		// its lease runs out.
		waitUntil(t, "the retried push of the close stage to settle", func() bool {
			res, err = a.pushGuide(t, closing)
			return err == nil
		})
		t.Logf("the consumer's retry: %+v", res)
	} else {
		t.Logf("A's route of the close stage: %+v", res)
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
		t.Fatalf("B's device got %v after the reminder %s; want its close stage %s: the reminder went to a user who came back because its close was decided %q, and the push of that close, refused while P missed its heartbeat and retried, settled %q (the retried claim judged the renewal, not the decision)",
			m, remind.ID, closing.ID, decided, res.Status)
	}
}
