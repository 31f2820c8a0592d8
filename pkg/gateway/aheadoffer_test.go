package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// aoOfferedFirst sets up the order a busy host gave the suite twice: a
// close stage c is kept ahead of its live delivery (its push's first
// step), and before the live copy reaches device B, connected and silent
// all along, an offer of the inbox (a route refresh's, a keep's) hands B
// the entry. B is queued the inbox copy first; the live copy then finds
// B sent that id already.
func aoOfferedFirst(t *testing.T, uid string) (*testGateway, *websocket.Conn, push.Request) {
	t.Helper()
	tg := startGateway(t, func(c *Config) { c.WriteTimeout = 30 * time.Second })
	wsB := tg.dial(t, uid)
	aofServed(t, wsB) // its connect's take is done: only the offer hands it c
	c := stagePush(uid, redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	payload, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	// As keepAhead keeps it.
	if n, err := tg.store.KeepGuide(context.Background(), uid, session.Keep{Entry: payload, MaxAge: tg.cfg.guideMaxAge(), TTL: tg.cfg.InboxTTL}); err != nil || n != session.KeptQueued {
		t.Fatalf("keep ahead: %d, %v", n, err)
	}
	tg.offerInbox(context.Background(), uid)
	waitUntil(t, "the offer hands B the entry", func() bool { return tg.aaLeases(uid) == 1 })
	if res := tg.mustPush(t, c, push.Delivered); res.Connections != 1 {
		t.Fatalf("delivered to %d connections, want 1", res.Connections)
	}
	return tg, wsB, c
}

// TestAheadOfferedCloseStillCloses: the live copy of a close stage that
// finds its connection sent the inbox copy (offered ahead of it) still
// applies its close there: B, on which the user was silent when the
// chat was closed, is closed with 4000 after the guide, as every
// connection the live copy reaches is. Before, the live copy was dropped
// as a copy, and B was shown that the chat was closed, and left open.
func TestAheadOfferedCloseStillCloses(t *testing.T) {
	_, wsB, c := aoOfferedFirst(t, "ao-closes")
	readStage(t, wsB, c)
	readClose(t, wsB) // answers the proof pings on the way
}

// TestAheadOfferedCloseKeptClosed: as above, and B's client is gone
// before it proves the guide: its close was applied, so the entry is
// kept marked closed for the user's next connect, as for a live copy
// written and never proven (see handOn). Before, the inbox copy's lease
// was released and the entry stayed as kept ahead, unclosed: stale by
// the user's next renewal, and the user never told on another device.
func TestAheadOfferedCloseKeptClosed(t *testing.T) {
	uid := "ao-kept"
	tg, wsB, c := aoOfferedFirst(t, uid)
	readStage(t, wsB, c)
	wsB.NetConn().Close()
	want := []string{c.ID + "(closed)"}
	if !waitFor(patience, func() bool { return tg.hub.count(uid) == 0 && slices.Equal(tg.aaInboxIDs(t, uid), want) }) {
		t.Fatalf("inbox %v, want %v: B's close, applied, was not kept closed", tg.aaInboxIDs(t, uid), want)
	}
}
