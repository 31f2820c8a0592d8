package gateway

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// dialFirstPing connects uid as a client that says its first frame is a
// ping (first=ping): the gateway holds its guides until then.
func (tg *testGateway) dialFirstPing(t *testing.T, uid string) *websocket.Conn {
	t.Helper()
	// In the hub before it returns, beside any connection uid had: a
	// push right after must find this one too.
	return tg.dialQuery(t, uid, "", "first=ping")
}

// pingSaying sends a ping with active_ago_ms ago (none when negative).
func pingSaying(t *testing.T, ws *websocket.Conn, ago int64) {
	t.Helper()
	f := `{"type":"ping"}`
	if ago >= 0 {
		f = fmt.Sprintf(`{"type":"ping","active_ago_ms":%d}`, ago)
	}
	if err := ws.WriteMessage(websocket.TextMessage, []byte(f)); err != nil {
		t.Fatal(err)
	}
}

// readPong reads the next frame and wants a pong.
func readPong(t *testing.T, ws *websocket.Conn) map[string]any {
	t.Helper()
	m := readJSON(t, ws)
	if m["type"] != "pong" {
		t.Fatalf("got %v, want pong", m)
	}
	return m
}

// silenceInInbox queues a silence's two stages, a reminder and a close,
// for uid, with no connection, and marks each produced in the listener's
// dedup window as a listener would have.
func silenceInInbox(t *testing.T, tg *testGateway, uid string, deadline int64) {
	t.Helper()
	ks := tg.store.Keyspace()
	for stage, due := range map[int]int64{1: deadline, 2: deadline + 1000} {
		dl := time.UnixMilli(deadline)
		tg.rdb.Set(context.Background(), ks.StageDedupKey(uid, stage, time.UnixMilli(due)), session.DedupProduced(dl), time.Hour)
	}
	tg.mustPush(t, push.Request{ID: uid + "-1", UID: uid, Text: "Still there?", DeadlineMS: deadline, DueMS: deadline, Stage: 1}, push.Queued)
	tg.mustPush(t, push.Request{ID: uid + "-2", UID: uid, Text: "Closed.", DeadlineMS: deadline, DueMS: deadline + 1000, Stage: 2,
		Action: "close", Final: true}, push.Queued)
}

// The inbox of a client that pings first is judged by what its first
// ping says of the user: a silence that ran out while they were there (by
// their client's record) is dropped, and marked stale in its dedup
// window; one that ran out after is handed over, before the pong.
func TestFirstPingJudgesInbox(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.GuideMaxAge = time.Hour })
	ctx := context.Background()
	ks := tg.store.Keyspace()
	ttl := (10 * time.Second).Milliseconds() // the test gateway's, without jitter

	t.Run("present after the deadline", func(t *testing.T) {
		deadline := redisNowMS(t, tg.rdb) - 3000
		silenceInInbox(t, tg, "typist", deadline)
		ws := tg.dialFirstPing(t, "typist")
		// Active 200 ms ago: the session would have run well past it.
		pingSaying(t, ws, 200)
		readPong(t, ws)
		pingPong(t, ws) // nothing came between: no guide at all
		if n, _ := tg.rdb.LLen(ctx, ks.InboxKey("typist")).Result(); n != 0 {
			t.Fatalf("inbox holds %d guides after a superseding word", n)
		}
		dl := strconv.FormatInt(deadline, 10)
		for stage, due := range map[int]int64{1: deadline, 2: deadline + 1000} {
			key := ks.StageDedupKey("typist", stage, time.UnixMilli(due))
			waitUntil(t, fmt.Sprintf("stage %d's dedup window marked stale", stage), func() bool {
				v, _ := tg.rdb.Get(ctx, key).Result()
				return v == "stale:"+dl
			})
		}
	})
	t.Run("present until a TTL before the deadline", func(t *testing.T) {
		deadline := redisNowMS(t, tg.rdb) - 3000
		silenceInInbox(t, tg, "walker", deadline)
		ws := tg.dialFirstPing(t, "walker")
		// Last active more than a TTL before the deadline (by 10 s, for a
		// slow machine between reading Redis's clock and the ping): a
		// silence.
		pingSaying(t, ws, 3000+ttl+10_000)
		readGuide(t, ws, "walker-1")
		if g := readGuide(t, ws, "walker-2"); g["final"] != true {
			t.Fatalf("close stage %v, want final", g)
		}
		readPong(t, ws)
		pingPong(t, ws) // the close stage handed over closed nothing
	})
	t.Run("no word", func(t *testing.T) {
		deadline := redisNowMS(t, tg.rdb) - 3000
		silenceInInbox(t, tg, "quiet", deadline)
		ws := tg.dialFirstPing(t, "quiet")
		pingSaying(t, ws, -1)
		readGuide(t, ws, "quiet-1")
		readGuide(t, ws, "quiet-2")
		readPong(t, ws)
	})
	t.Run("a word from the future is not taken", func(t *testing.T) {
		deadline := redisNowMS(t, tg.rdb) - 3000
		silenceInInbox(t, tg, "seer", deadline)
		ws := tg.dialFirstPing(t, "seer")
		if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping","active_ago_ms":-60000}`)); err != nil {
			t.Fatal(err)
		}
		readGuide(t, ws, "seer-1")
		readGuide(t, ws, "seer-2")
		readPong(t, ws)
	})
	t.Run("a client that does not ask gets its inbox at once", func(t *testing.T) {
		deadline := redisNowMS(t, tg.rdb) - 3000
		silenceInInbox(t, tg, "elder", deadline)
		ws := tg.dial(t, "elder")
		readGuide(t, ws, "elder-1")
		readGuide(t, ws, "elder-2")
		pingSaying(t, ws, 0) // said too late: the inbox was handed over
		readPong(t, ws)
	})
}

// A client that asked to ping first and sends nothing gets its inbox at
// the bound.
func TestFirstPingWaitBounded(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.GuideMaxAge = time.Hour
		c.firstPingWaitFor = 300 * time.Millisecond
	})
	deadline := redisNowMS(t, tg.rdb) - 3000
	silenceInInbox(t, tg, "mute", deadline)
	ws := tg.dialFirstPing(t, "mute")
	readGuide(t, ws, "mute-1")
	readGuide(t, ws, "mute-2")
}

// Guides pushed live to a connection that holds its guides wait for its
// first ping and are judged by it: a close stage of a silence the user
// was there for neither shows nor closes anything, nor counts a user
// closed for inactivity. After the word, a push of such a silence is
// answered stale; one of a later silence is delivered. The connection
// drops its hold once over.
func TestFirstPingJudgesLiveGuides(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	closed0 := counterValue(t, metricClosedInactive)
	ws := tg.dialFirstPing(t, "rider")
	deadline := redisNowMS(t, tg.rdb) - 1000
	tg.mustPush(t, push.Request{ID: "r1", UID: "rider", Text: "Closed.", DeadlineMS: deadline, Stage: 2, Action: "close", Final: true}, push.Delivered)
	pingSaying(t, ws, 0)
	readPong(t, ws)
	pingPong(t, ws) // open, renewing: no guide, no 4000
	if !sessionExists(tg, "rider") {
		t.Fatal("the session was ended by a close stage the user was there for")
	}
	if d := counterValue(t, metricClosedInactive) - closed0; d != 0 {
		t.Errorf("a close stage dropped as superseded counted %v users closed", d)
	}
	for _, c := range tg.hub.lookup("rider") {
		if c.holding() {
			t.Error("the connection keeps its hold after its first ping")
		}
	}
	tg.mustPush(t, push.Request{ID: "r2", UID: "rider", Text: "Still there?", DeadlineMS: deadline, Stage: 1}, push.Stale)
	later := redisNowMS(t, tg.rdb) + 20_000 // past the word's reach
	tg.mustPush(t, push.Request{ID: "r3", UID: "rider", Text: "Still there?", DeadlineMS: later, Stage: 1}, push.Delivered)
	readGuide(t, ws, "r3")
	pingPong(t, ws) // reading answered the gateway's ping: r3 is proven
	// Kept ahead of their delivery, r1 (superseded) and r3 (proven) leave
	// the inbox.
	waitUntil(t, "the inbox empties", func() bool {
		return tg.rdb.LLen(ctx, tg.store.Keyspace().InboxKey("rider")).Val() == 0
	})
}

// Guides held by a connection that ended before its first frame are kept
// in the inbox for the next connect.
func TestHeldGuidesKeptWhenConnectionEnds(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	ws := tg.dialFirstPing(t, "flaky")
	tg.mustPush(t, push.Request{ID: "f1", UID: "flaky", Text: "Still there?", DeadlineMS: redisNowMS(t, tg.rdb) - 1000, Stage: 1}, push.Delivered)
	ws.Close()
	waitUntil(t, "the held guide back in the inbox", func() bool {
		n, _ := tg.rdb.LLen(ctx, tg.store.Keyspace().InboxKey("flaky")).Result()
		return n == 1
	})
	readGuide(t, tg.dial(t, "flaky"), "f1")
}

// TestParseEntry: an inbox entry of every release reads as the request
// it was kept from (the times its keeping added are not the request's);
// one without an id, which its lease is by, or that does not parse, is
// refused.
func TestParseEntry(t *testing.T) {
	want := push.Request{ID: "g1", UID: "alice", Text: "Still there?", DeadlineMS: 1763720000123, Stage: 2,
		Action: timeoutevent.ActionClose, Final: true}
	const req = `{"id":"g1","uid":"alice","text":"Still there?","deadline_ms":1763720000123,"stage":2,"action":"close","final":true`
	for _, raw := range []string{
		req + `}`, // a gateway before the inbox added times
		req + `,"kept_ms":1763720000200,"expires_ms":1763720300123}`,
		req + `,"kept_ms":1763720000200,"expires_ms":1763720300200,"closed_ms":1763720000200}`,
	} {
		if got, ok := parseEntry(raw); !ok || got != want {
			t.Errorf("parseEntry(%s) = %+v, %v; want %+v", raw, got, ok, want)
		}
	}
	for _, raw := range []string{`{"uid":"alice","text":"t","kept_ms":1,"expires_ms":2}`, `not json`, `{"id":7}`} {
		if got, ok := parseEntry(raw); ok {
			t.Errorf("parseEntry(%s) = %+v, want it refused", raw, got)
		}
	}
}
