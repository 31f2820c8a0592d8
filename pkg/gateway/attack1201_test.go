package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on handover.there: an inbox copy of a close stage counts as
// handed to a connection that was there when the chat closed if the
// entry's kept_ms is at or after the connection's openedMS. kept_ms is
// when the entry was last kept, not when the close was applied: a keep
// marked closed (handOn of a device that was written the close and never
// proved it) replaces the entry kept ahead, with kept_ms now.

// a1201KeepClosed keeps c marked closed, as the handOn of another
// instance's connection that was written c and ended unproven keeps it
// (kept_ms: now). That instance offers it only to its own connections.
func (tg *testGateway) a1201KeepClosed(t *testing.T, c push.Request) {
	t.Helper()
	payload, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := tg.store.KeepGuide(context.Background(), c.UID, session.Keep{Entry: payload, MaxAge: tg.cfg.guideMaxAge(),
		Cap: tg.cfg.InboxSize, TTL: tg.cfg.InboxTTL, Closed: true}); err != nil || n != session.KeptQueued {
		t.Fatalf("keep c closed: %d, %v", n, err)
	}
}

// TestAttack1201ReKeptClosedCameBackClosed: device D is connected here,
// silent, when close stage c is pushed on another instance P: P keeps c
// ahead (behind stage 1's entry r, kept ahead of its own live copy), writes
// it to the user's device A there (the close is applied), and routes it
// here for D. The user then comes back on a new device B here, after the
// close: B's connect's take (a chunk of one guide) hands it r. A's client
// is gone without proving c, and P's handOn keeps c marked closed, which
// replaces the entry with kept_ms = now, after B opened. B acks r; the
// next chunk's take hands B c (a later chunk: connect false), and
// there() finds kept_ms >= B's openedMS: B counts as there when the chat
// closed. B is shown c, acks it and pings (the user is back). Then the
// routed copy is read here, late: D is shown c and closed, as it must
// be; B, which opened after the close and was told of it by the inbox,
// must stay open, as a device handed c by its connect's own take does
// (TestAttackOfferCameBackNotClosed). It is closed 4000 "inactive", and
// the session its ping renewed is ended.
func TestAttack1201ReKeptClosedCameBackClosed(t *testing.T) {
	ctx := context.Background()
	uid := "a1201-rekept"
	tg := startGateway(t, func(c *Config) {
		c.SendQueue = 2 // a chunk of one guide
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour // only the handover hands the inbox
	})
	wsD := tg.dial(t, uid) // there, silent, when the chat is closed
	aofServed(t, wsD)

	deadline := redisNowMS(t, tg.rdb)
	r := stagePush(uid, deadline, 1, timeoutevent.ActionRemind)
	c := stagePush(uid, deadline, 2, timeoutevent.ActionClose)
	tg.aofKeepAhead(t, r)
	tg.aofKeepAhead(t, c)
	// P writes c to A: its close is applied.
	if applied, err := tg.store.CommitClose(ctx, uid, c.ID, c.DeadlineMS, pushedTTL); err != nil || !applied {
		t.Fatalf("the close applied on the other instance's device: %v, %v", applied, err)
	}
	// B opens clearly after the close: its openedMS is an estimate, early
	// by a moment.
	closedAt, err := tg.store.CloseAppliedAt(ctx, uid, c.ID)
	if err != nil || closedAt == 0 {
		t.Fatalf("the close applied at %d, %v", closedAt, err)
	}
	waitUntil(t, "Redis's clock past the close", func() bool { return redisNowMS(t, tg.rdb) > closedAt+100 })

	// The user comes back, on a new device, after the close.
	wsB := tg.dial(t, uid)
	readStage(t, wsB, r) // the connect's take; not proven yet
	var openedMS int64
	waitUntil(t, "B registered", func() bool {
		for _, cn := range tg.hub.lookup(uid) {
			if cn.openedMS > openedMS {
				openedMS = cn.openedMS
			}
		}
		return len(tg.hub.lookup(uid)) == 2
	})
	tg.a1201KeepClosed(t, c) // A's handOn, on P
	if got, want := tg.aaInboxIDs(t, uid), []string{r.ID, c.ID + "(closed)"}; !slices.Equal(got, want) {
		t.Fatalf("inbox %v, want %v", got, want)
	}
	if kept := tg.a1201KeptMS(t, uid, c.ID); kept < openedMS || openedMS <= closedAt {
		t.Fatalf("c applied at %d, re-kept at %d; B opened at %d: the test's premise (B opened between) fails", closedAt, kept, openedMS)
	}

	aaAck(t, wsB, r.ID) // the next chunk is taken: c
	readStage(t, wsB, c)
	aaAck(t, wsB, c.ID)
	pingPong(t, wsB) // renews: the user is back
	waitUntil(t, "B's inbox copies proven, and out of the inbox", func() bool {
		return len(tg.aaInboxIDs(t, uid)) == 0 && tg.aaLeases(uid) == 0
	})

	tg.readRouted(t, c) // P's routed copy, read late
	readStage(t, wsD, c)
	readClose(t, wsD)
	aofStillOpen(t, wsB, "B, opened after the close and handed it from the inbox,")
	if !sessionExists(tg, uid) {
		t.Error("the user who came back on B has no session")
	}
}

// a1201KeptMS is kept_ms of uid's inbox entry of guide id.
func (tg *testGateway) a1201KeptMS(t *testing.T, uid, id string) int64 {
	t.Helper()
	raw, err := tg.rdb.LRange(context.Background(), tg.store.Keyspace().InboxKey(uid), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range raw {
		var v struct {
			ID     string `json:"id"`
			KeptMS int64  `json:"kept_ms"`
		}
		if json.Unmarshal([]byte(e), &v) == nil && v.ID == id && v.KeptMS > 0 {
			return v.KeptMS
		}
	}
	t.Fatalf("no entry of %s with kept_ms in %q's inbox", id, uid)
	return 0
}

// TestAttack1201KeptBeforeOpenAppliedAfterNeverClosed: the mirror case.
// Close stage c's push on another instance P keeps it ahead (behind stage
// 1's entry r, kept ahead of its own live copy), and is slow to write it
// (a busy host, a pause mid-push). Meanwhile the user's device D connects
// here: its connect's take (a chunk of one guide) hands it r, not c. P
// then writes c to the user's device A there: the close is applied while
// D is open and its user silent (D never pings). D acks r; the next
// chunk's take hands it c, and there() finds kept_ms before D's openedMS:
// D counts as the user come back. P's route, read after D registered,
// sent c here too; read here, the live copy finds D sent the inbox copy
// and is dropped as a copy. D was there, silent, when the chat closed
// (docs/protocol.md, "Inbox": a close stage's inbox copy closes nothing
// "unless the connection was open, its user silent, when the close was
// applied"), and was shown the close: it must be closed 4000, and the
// session ended, as TestAheadLaterChunkStillCloses has it when c is kept
// a moment later, after D opened. D is left open, its session alive.
func TestAttack1201KeptBeforeOpenAppliedAfterNeverClosed(t *testing.T) {
	ctx := context.Background()
	uid := "a1201-kept-before"
	tg := startGateway(t, func(c *Config) {
		c.SendQueue = 2 // a chunk of one guide
		c.WriteTimeout = 30 * time.Second
		c.routeRefreshEvery = time.Hour // only the handover hands the inbox
	})
	deadline := redisNowMS(t, tg.rdb)
	r := stagePush(uid, deadline, 1, timeoutevent.ActionRemind)
	c := stagePush(uid, deadline, 2, timeoutevent.ActionClose)
	tg.aofKeepAhead(t, r)
	tg.aofKeepAhead(t, c) // P's push, which then stalls
	keptMS := tg.a1201KeptMS(t, uid, c.ID)
	// D opens during P's stall, clearly after c was kept (openedMS is an
	// estimate of Redis's clock, a round trip early at most).
	waitUntil(t, "Redis's clock past c's keep", func() bool { return redisNowMS(t, tg.rdb) > keptMS+100 })

	wsD := tg.dial(t, uid)
	readStage(t, wsD, r) // the connect's take; not proven yet
	for _, cn := range tg.hub.lookup(uid) {
		if cn.openedMS <= keptMS {
			t.Fatalf("D opened at %d, c kept at %d: the test's premise fails", cn.openedMS, keptMS)
		}
	}
	// P writes c to A: the close is applied, D open and silent.
	if applied, err := tg.store.CommitClose(ctx, uid, c.ID, c.DeadlineMS, pushedTTL); err != nil || !applied {
		t.Fatalf("the close applied on the other instance's device: %v, %v", applied, err)
	}
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
}
