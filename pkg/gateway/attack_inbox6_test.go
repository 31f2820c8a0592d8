package gateway

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackInbox6LeftCloseTimedAsNeverConnected: a closed entry that a
// take leaves (stale for the taking connection, owed only to a device
// open since before the close, of which there is none) goes at its
// expiry, and the take that finds it expired records it in the user's
// timeline as "expired before the user connected" (too-old). The user
// did connect, twice, before it expired, and renewed after its close:
// it was handed to one connection (which never proved it) and left by
// the other. The take that used to drop it recorded it as came-back;
// the timeline now gives a false reason, and the inbox_expired metric
// counts it where inbox_stale did.
//
// Device B is pushed close stage c and its close is applied; B's
// client is gone before proving it: c is kept closed. Device B2
// connects and is handed c (leased), its client reading nothing. Device
// B3 connects (finding c leased) and pings: a renewal after the close.
// B2 goes unproven: its lease is released and the inbox offered to B3,
// for which c is stale: left. Past its max age, the next take drops it
// as expired.
func TestAttackInbox6LeftCloseTimedAsNeverConnected(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.GuideMaxAge = 3 * time.Second
		c.WriteTimeout = 30 * time.Second // no client is cut off for want of proof
	})
	ctx := context.Background()
	uid := "ai6-expired"
	ks := tg.store.Keyspace()

	wsB := tg.dial(t, uid)
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	tg.mustPush(t, c, push.Delivered)
	readStage(t, wsB, c)  // written: B's close is applied
	wsB.NetConn().Close() // B's client is gone before it proves it
	waitUntil(t, "B's applied close stage kept closed", func() bool {
		ids := tg.aaInboxIDs(t, uid)
		return tg.hub.count(uid) == 0 && len(ids) == 1 && ids[0] == c.ID+"(closed)"
	})
	raw, err := tg.rdb.LIndex(ctx, ks.InboxKey(uid), 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	closedMS := entryClosedMS(t, raw)

	wsB2 := tg.dial(t, uid) // handed c from the inbox; reads nothing
	waitUntil(t, "c leased to B2's handover", func() bool { return tg.aaLeases(uid) == 1 })
	wsB3 := tg.dial(t, uid)
	pingPong(t, wsB3) // finds c leased; its ping renews
	waitUntil(t, "a renewal after c's close", func() bool {
		rn, _ := strconv.ParseInt(tg.rdb.Get(ctx, ks.RenewedKey(uid)).Val(), 10, 64)
		return rn > closedMS
	})

	wsB2.NetConn().Close() // B2's client is gone, unproven
	waitUntil(t, "B2 ends and its lease is released", func() bool { return tg.hub.count(uid) == 1 && tg.aaLeases(uid) == 0 })
	// The release's offer to B3 takes the inbox: c is left, stale for
	// B3, opened after the close (the take before this change dropped it
	// as stale, and said so). Whenever that take comes, the steps below
	// wait on Redis's clock, and c's fate is read at the end.

	// A later silence's reminder g, pushed to B3 (whose client reads
	// nothing now), is kept ahead after c: the inbox outlives c.
	waitUntil(t, "2 s past c's close", func() bool { return redisNowMS(t, tg.rdb) >= closedMS+2000 })
	g := push.Request{ID: "g", UID: uid, Text: "Still there?", DeadlineMS: redisNowMS(t, tg.rdb), Stage: 1}
	tg.mustPush(t, g, push.Delivered)

	// Past c's max age (3s from its keep, by Redis's clock), and within
	// g's, the inbox is offered again (a route refresh, a keep, a
	// release would).
	waitUntil(t, "c past its max age", func() bool { return redisNowMS(t, tg.rdb) > closedMS+3100 })
	tg.offerInbox(ctx, uid)
	waitUntil(t, "c gone from the inbox", func() bool {
		for _, id := range tg.aaInboxIDs(t, uid) {
			if strings.HasPrefix(id, c.ID) {
				return false
			}
		}
		return true
	})

	// The timeline is written in batches: wait for c's last word.
	var tl []timeline.Entry
	waitUntil(t, "c's drop in the timeline", func() bool {
		var err error
		if tl, err = timeline.Read(ctx, tg.store, uid, 0); err != nil {
			t.Fatal(err)
		}
		for _, e := range tl {
			if e.Event == c.ID && e.Kind == timeline.KindSkipped {
				return true
			}
		}
		return false
	})
	for _, e := range tl {
		if e.Event == c.ID && e.Kind == timeline.KindSkipped && strings.Contains(e.Detail, "before the user connected") {
			for _, e := range tl {
				t.Logf("timeline: %s %s %s %s", e.Kind, e.Rule, e.Event, e.Detail)
			}
			t.Errorf("the close stage %s is recorded %s: %q; the user connected twice before it expired (one connection was handed it) and renewed after its close: it was left for a device open since before the close, and none took it", c.ID, e.Rule, e.Detail)
		}
	}
}

// entryClosedMS reads an inbox entry's closed_ms.
func entryClosedMS(t *testing.T, raw string) int64 {
	t.Helper()
	i := strings.Index(raw, `"closed_ms":`)
	if i < 0 {
		t.Fatalf("entry %s not closed", raw)
	}
	s := raw[i+len(`"closed_ms":`):]
	if j := strings.IndexAny(s, ",}"); j >= 0 {
		s = s[:j]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("entry %s: closed_ms: %v", raw, err)
	}
	return n
}
