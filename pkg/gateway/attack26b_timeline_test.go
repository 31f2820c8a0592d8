package gateway

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/timeline"
)

// attack26bEnded waits until uid's timeline holds an end entry (the
// connection's normal close, recorded after every frame the connection
// read before it) and returns the whole timeline.
func attack26bEnded(t *testing.T, tg *testGateway, uid string) []timeline.Entry {
	t.Helper()
	var got []timeline.Entry
	waitUntil(t, uid+"'s end in the timeline", func() bool {
		var err error
		if got, err = timeline.Read(context.Background(), tg.store, uid, 0); err != nil {
			t.Fatal(err)
		}
		for _, e := range got {
			if e.Kind == timeline.KindEnd {
				return true
			}
		}
		return false
	})
	return got
}

func attack26bClose(ws *websocket.Conn) {
	ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
}

// TestAttack26bRepeatedAckFloodsTimeline proves that a client can fill
// its user's timeline with acks: ackProof reports an id as "known" for as
// long as it is among the connection's last 8 guides, proven or not, so
// every ack of the same real guide id is recorded again. The rule meant
// that "a client cannot fill it with acks of ids it made up"; with a real
// id it can, within the frame rate limit (5/s, burst 20, by default):
// 100 entries, the whole default timeline, in about 16 s, pushing out the
// lapse, holds, sends and closes a support person reads it for. Each is
// also a Redis write. One ack of one guide is one fact: one entry.
func TestAttack26bRepeatedAckFloodsTimeline(t *testing.T) {
	tg := startGateway(t, nil)
	const uid = "tl-acker"
	ws := tg.dial(t, uid)
	tg.waitTimeline(t, uid, "start:started")
	tg.mustPush(t, push.Request{ID: "g-once", UID: uid, Text: "Still there?"}, push.Delivered)
	readGuide(t, ws, "g-once")
	// Within the default burst (20): no rate-limit close.
	const acks = 15
	for range acks {
		if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ack","id":"g-once"}`)); err != nil {
			t.Fatal(err)
		}
	}
	attack26bClose(ws)
	got := attack26bEnded(t, tg, uid)
	n := 0
	for _, e := range got {
		if e.Kind == timeline.KindAcked && e.Event == "g-once" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d acks of one guide left %d acked entries in the timeline (%s), want 1: a client floods its user's timeline with a real id",
			acks, n, timeline.Kinds(got))
	}
}

// TestAttack26bSupersededGuideLeavesSentDelivered proves that a guide the
// gateway drops as superseded (the client's first ping says the user was
// there: first=ping, see present.go) leaves no trace in the timeline,
// although the push was answered as sent.
//
// The push to a connection that holds its guides is answered "delivered,
// 1 connection" (held counts as taken), or "queued" for a user connected
// nowhere, and the consumer records exactly that: "sent: delivered to 1
// connection" / "sent: inbox, kept for the next connect" (and for a close
// stage "closed: the user is told at their next connect"). Then the hold
// ends, the guide is dropped as superseded, the user sees nothing, no
// chat is closed, and the gateway records nothing. A support person asked
// "the bot nudged me?" / "why was nobody nudged?" reads a guide sent that
// never reached anyone, and nothing after it: the brief's "a 'sent
// delivered' for a guide that was not delivered", and a missing entry for
// an outcome only the gateway sees.
func TestAttack26bSupersededGuideLeavesSentDelivered(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.GuideMaxAge = time.Hour })

	t.Run("pushed live to a held connection", func(t *testing.T) {
		const uid = "tl-rider"
		ws := tg.dialFirstPing(t, uid)
		deadline := redisNowMS(t, tg.rdb) - 1000
		res := tg.mustPush(t, push.Request{ID: "held-1", UID: uid, Text: "Still there?", DeadlineMS: deadline, Stage: 1}, push.Delivered)
		if res.Connections != 1 {
			t.Fatalf("push answered %+v: want delivered to 1 connection, what the consumer records as sent", res)
		}
		pingSaying(t, ws, 0) // active just now: the guide is superseded
		readPong(t, ws)
		pingPong(t, ws) // nothing came between: the user saw no guide
		attack26bClose(ws)
		got := attack26bEnded(t, tg, uid)
		if !attack26bMentions(got, "held-1") {
			t.Errorf("timeline %s says nothing of guide held-1, answered delivered to 1 connection (the consumer's \"sent: delivered\") and then dropped as superseded: it reads as shown",
				attack26bDescribe(got))
		}
	})

	t.Run("kept in the inbox", func(t *testing.T) {
		const uid = "tl-typist"
		deadline := redisNowMS(t, tg.rdb) - 3000
		silenceInInbox(t, tg, uid, deadline) // both answered queued: the consumer's "sent: inbox", "closed: inbox"
		ws := tg.dialFirstPing(t, uid)
		pingSaying(t, ws, 200)
		readPong(t, ws)
		pingPong(t, ws) // no guide: both dropped as superseded
		attack26bClose(ws)
		got := attack26bEnded(t, tg, uid)
		for _, id := range []string{uid + "-1", uid + "-2"} {
			if !attack26bMentions(got, id) {
				t.Errorf("timeline %s says nothing of guide %s, answered queued (the consumer's \"sent: inbox\"%s) and dropped as superseded at the connect",
					attack26bDescribe(got), id, map[bool]string{true: ", \"closed: the user is told at their next connect\""}[strings.HasSuffix(id, "-2")])
			}
		}
	})
}

func attack26bMentions(es []timeline.Entry, id string) bool {
	for _, e := range es {
		if e.Event == id {
			return true
		}
	}
	return false
}

func attack26bDescribe(es []timeline.Entry) string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = fmt.Sprintf("%s:%s(%s)", e.Kind, e.Rule, e.Event)
	}
	return strings.Join(out, " ")
}
