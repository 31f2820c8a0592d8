package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on handover.there's applied time: it reads when a close stage
// was decided applied from CloseAtKey, and falls back on the entry's
// kept_ms when the key is absent. These found closes decided applied
// without the time kept (LaterStageGoes's SETNX; a close stage pushed
// without deadline_ms, applied with no decision at all) judged by when
// their entry was kept: both now keep it (Store.ApplyClose). A close
// decided by a gateway from before the key, during a rolling upgrade, is
// still judged by kept_ms (see docs/operations.md, "Upgrades").

// a1201bDecide decides close stage c applied, the way named by how.
func (tg *testGateway) a1201bDecide(t *testing.T, c push.Request, how string) {
	t.Helper()
	ctx := context.Background()
	switch how {
	case "close_commit":
		// A connection of this version about to write it.
		if applied, err := tg.store.CommitClose(ctx, c.UID, c.ID, c.DeadlineMS, pushedTTL); err != nil || !applied {
			t.Fatalf("the close applied: %v, %v", applied, err)
		}
	case "LaterStageGoes":
		// Another instance reads stage 1 of the silence late, routed to
		// a device there, after the user renewed past the deadline: c
		// is claimed, so the reminder goes out and c's close is decided
		// applied (cameBackRouted).
		goes, err := tg.store.LaterStageGoes(ctx, c.UID, c.DeadlineMS, 1, pushedTTL, string(push.Delivered), string(push.Queued))
		if err != nil || !goes {
			t.Fatalf("LaterStageGoes: %v, %v; want the later stage going", goes, err)
		}
		if got, err := tg.rdb.Get(ctx, tg.store.Keyspace().CloseKey(c.UID, c.ID)).Result(); err != nil || got != "applied" {
			t.Fatalf("c's close decision %q, %v; want applied", got, err)
		}
	default:
		t.Fatalf("unknown decision %q", how)
	}
}

// TestAttack1201bCameBackClosedWhenDecidedWithoutTime: close stage c of
// a silence is claimed by its push on another instance P, which stalls
// before its route. The user comes back (a renewal past the deadline,
// on a device or through the platform), and the close is decided
// applied without its time being kept: by another instance that reads
// stage 1 late (LaterStageGoes: the reminder goes out, as c was claimed
// before the user came back), before it kept the time too.
// Then the user opens a new device B here, well after the close, and
// pings. P resumes: it keeps c ahead, routes it here (B is in the route)
// and writes it to the user's device A there, whose client is gone
// before proving it: A's handOn keeps c marked closed, kept_ms now,
// after B opened. A route refresh here offers the inbox: B is handed c,
// acks it and pings. Then P's routed copy is read here. B opened after
// the chat was closed and was told by the inbox: a close stage handed
// over "closes nothing ... unless the connection was open, its user
// silent, when the close was applied" (docs/protocol.md, "Inbox"), as
// the subtest whose close this version's close_commit decided shows.
// With the time unknown, there() judges by kept_ms, counts B there when
// the chat closed, and the routed copy closes B 4000 and ends the
// session B's ping renewed.
func TestAttack1201bCameBackClosedWhenDecidedWithoutTime(t *testing.T) {
	for _, how := range []string{"close_commit", "LaterStageGoes"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			uid := "a1201b-back-" + newToken()[:8]
			tg := startGateway(t, func(c *Config) {
				c.WriteTimeout = 30 * time.Second
				c.routeRefreshEvery = time.Hour // only the test offers the inbox
			})
			deadline := redisNowMS(t, tg.rdb) - 1000
			c := stagePush(uid, deadline, 2, timeoutevent.ActionClose)
			// P's push of c: claimed, then stalled before its route.
			if state, err := tg.store.ClaimPush(ctx, uid, c.ID, newToken(), claimTTL, deadline); err != nil || state != session.PushFresh {
				t.Fatalf("claim c: %v, %v", state, err)
			}
			// The user comes back, past the deadline, elsewhere: before
			// the close was decided (a late reminder decides it so), or
			// after a connection about to write it decided it.
			renew := func() {
				if _, err := tg.store.Renew(ctx, uid, session.DefaultSegment, time.Minute, session.ClockPresence); err != nil {
					t.Fatal(err)
				}
			}
			if how == "LaterStageGoes" {
				renew()
				tg.a1201bDecide(t, c, how)
			} else {
				tg.a1201bDecide(t, c, how)
				renew()
			}
			decided := redisNowMS(t, tg.rdb)
			// B opens clearly after the close (openedMS is an estimate of
			// Redis's clock, a round trip early at most).
			waitUntil(t, "Redis's clock past the close", func() bool { return redisNowMS(t, tg.rdb) > decided+100 })

			wsB := tg.dial(t, uid)
			aofServed(t, wsB)
			pingPong(t, wsB) // the user is back, on B
			var openedMS int64
			for _, cn := range tg.hub.lookup(uid) {
				openedMS = cn.openedMS
			}
			if openedMS <= decided {
				t.Fatalf("B opened at %d, the close decided by %d: the test's premise fails", openedMS, decided)
			}

			// P resumes: kept ahead, written to A (applied already), A's
			// client gone unproven: kept closed (A's handOn, on P).
			tg.aofKeepAhead(t, c)
			tg.a1201KeepClosed(t, c)
			if kept := tg.a1201KeptMS(t, uid, c.ID); kept < openedMS {
				t.Fatalf("c kept closed at %d, before B opened (%d): the test's premise fails", kept, openedMS)
			}
			// The route refresh here offers the inbox.
			tg.offerInbox(ctx, uid)
			readStage(t, wsB, c)
			aaAck(t, wsB, c.ID)
			pingPong(t, wsB)
			waitUntil(t, "B's inbox copy proven, and out of the inbox", func() bool {
				return len(tg.aaInboxIDs(t, uid)) == 0 && tg.aaLeases(uid) == 0
			})

			tg.readRouted(t, c) // P's routed copy, read late
			aofStillOpen(t, wsB, "B, opened after the close ("+how+") and handed it from the inbox,")
			if !sessionExists(tg, uid) {
				t.Error("the user who came back on B has no session")
			}
		})
	}
}

// TestAttack1201bNoDeadlineCloseJudgedByKeep: a close stage pushed
// without deadline_ms (optional in the push contract) is never decided:
// commitClose applies it without asking Redis, so no connection that
// writes it records when the chat closed, and there() judges its inbox
// copy by kept_ms, as before the change. Both cases the change fixed for
// a close with a deadline come back:
//
//   - re-kept closed: P keeps stage 1's r and close stage c ahead and
//     writes c to the user's device A there; the user then comes back on
//     a new device B here, whose connect's take (a chunk of one) hands it
//     r; A's client is gone unproven, and P's handOn keeps c closed,
//     kept_ms after B opened. The next chunk hands B c, B pings; P's
//     routed copy, read late, closes B 4000 and ends its renewed session;
//   - kept before open, applied after: P keeps c ahead (behind stage 1's
//     r) and stalls; device D connects here, its connect's take hands it
//     r; P writes c to A while D is open and silent; the next chunk
//     hands D c, kept before D opened, and P's routed copy is dropped on
//     D as a copy: D is shown the close and never closed.
func TestAttack1201bNoDeadlineCloseJudgedByKeep(t *testing.T) {
	undated := func(uid string, stage int, action string) push.Request {
		req := stagePush(uid, 0, stage, action)
		req.ID = uid + "-stage-" + action
		return req
	}
	t.Run("re-kept closed, came back closed", func(t *testing.T) {
		uid := "a1201b-undated-back"
		tg := startGateway(t, func(c *Config) {
			c.SendQueue = 2 // a chunk of one guide
			c.WriteTimeout = 30 * time.Second
			c.routeRefreshEvery = time.Hour // only the handover hands the inbox
		})
		r := undated(uid, 1, timeoutevent.ActionRemind)
		c := undated(uid, 2, timeoutevent.ActionClose)
		tg.aofKeepAhead(t, r)
		tg.aofKeepAhead(t, c) // P's push: kept ahead, and written to A
		// A connection about to write a close without a deadline applies
		// it (commitClose), and the time is kept.
		if applied, err := tg.store.ApplyClose(context.Background(), uid, c.ID, pushedTTL); err != nil || !applied {
			t.Fatalf("the close applied on the other instance's device: %v, %v", applied, err)
		}
		written, err := tg.store.CloseAppliedAt(context.Background(), uid, c.ID)
		if err != nil || written == 0 {
			t.Fatalf("the close applied at %d, %v", written, err)
		}
		waitUntil(t, "Redis's clock past the close", func() bool { return redisNowMS(t, tg.rdb) > written+100 })

		wsB := tg.dial(t, uid) // the user comes back, after the close
		readStage(t, wsB, r)   // the connect's take; not proven yet
		var openedMS int64
		waitUntil(t, "B registered", func() bool {
			for _, cn := range tg.hub.lookup(uid) {
				openedMS = cn.openedMS
			}
			return openedMS > 0
		})
		if openedMS <= written {
			t.Fatalf("B opened at %d, the close written by %d: the test's premise fails", openedMS, written)
		}
		// A's client gone unproven: A's handOn, on P, keeps c closed.
		tg.a1201KeepClosed(t, c)
		if kept := tg.a1201KeptMS(t, uid, c.ID); kept < openedMS {
			t.Fatalf("c re-kept at %d, before B opened (%d): the test's premise fails", kept, openedMS)
		}
		aaAck(t, wsB, r.ID) // the next chunk is taken: c
		readStage(t, wsB, c)
		aaAck(t, wsB, c.ID)
		pingPong(t, wsB) // the user is back
		waitUntil(t, "B's inbox copies proven, and out of the inbox", func() bool {
			return len(tg.aaInboxIDs(t, uid)) == 0 && tg.aaLeases(uid) == 0
		})
		tg.readRouted(t, c) // P's routed copy, read late
		aofStillOpen(t, wsB, "B, opened after the close and handed it from the inbox,")
		if !sessionExists(tg, uid) {
			t.Error("the user who came back on B has no session")
		}
	})
	t.Run("kept before open, applied after, never closed", func(t *testing.T) {
		uid := "a1201b-undated-before"
		tg := startGateway(t, func(c *Config) {
			c.SendQueue = 2 // a chunk of one guide
			c.WriteTimeout = 30 * time.Second
			c.routeRefreshEvery = time.Hour // only the handover hands the inbox
		})
		r := undated(uid, 1, timeoutevent.ActionRemind)
		c := undated(uid, 2, timeoutevent.ActionClose)
		tg.aofKeepAhead(t, r)
		tg.aofKeepAhead(t, c) // P's push, which then stalls
		keptMS := tg.a1201KeptMS(t, uid, c.ID)
		waitUntil(t, "Redis's clock past c's keep", func() bool { return redisNowMS(t, tg.rdb) > keptMS+100 })

		wsD := tg.dial(t, uid)
		readStage(t, wsD, r) // the connect's take; not proven yet
		for _, cn := range tg.hub.lookup(uid) {
			if cn.openedMS <= keptMS {
				t.Fatalf("D opened at %d, c kept at %d: the test's premise fails", cn.openedMS, keptMS)
			}
		}
		// P writes c to A: applied (no decision to make), D open and silent.
		aaAck(t, wsD, r.ID) // proof, no renewal: the next chunk is taken
		readStage(t, wsD, c)
		aaAck(t, wsD, c.ID)
		waitUntil(t, "D's inbox copies proven, and out of the inbox", func() bool {
			return len(tg.aaInboxIDs(t, uid)) == 0 && tg.aaLeases(uid) == 0
		})
		tg.readRouted(t, c) // P's routed copy
		readClose(t, wsD)   // no second guide frame before it
		waitUntil(t, "D ends, and its 4000 ends the session", func() bool {
			return tg.hub.count(uid) == 0 && !sessionExists(tg, uid)
		})
	})
}
