package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/activity"
	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/token"
)

// waitTimeline waits until uid's timeline holds the kind:rule entries
// want, in order, and returns them. The recorder sends its batch every
// 50ms: the wait is on the entries, not on time.
func (tg *testGateway) waitTimeline(t *testing.T, uid string, want ...string) []timeline.Entry {
	t.Helper()
	var got []timeline.Entry
	if !waitFor(patience, func() bool {
		var err error
		if got, err = timeline.Read(context.Background(), tg.store, uid, 0); err != nil {
			t.Fatal(err)
		}
		return len(got) >= len(want)
	}) || timeline.Kinds(got) != strings.Join(want, " ") {
		t.Fatalf("%s's timeline: %s, want %s", uid, timeline.Kinds(got), strings.Join(want, " "))
	}
	for i, e := range got {
		if e.Service != "gateway" || e.Instance != tg.instance {
			t.Errorf("entry %d recorded by %s/%s, want gateway/%s", i, e.Service, e.Instance, tg.instance)
		}
	}
	return got
}

// TestTimelineConnectAndNormalClose: a device's connect starts the
// user's session, its normal close ends it, and the timeline says both,
// with the close code.
func TestTimelineConnectAndNormalClose(t *testing.T) {
	tg := startGateway(t, nil)
	ws := tg.dialSegment(t, "tl-ann", "vip")
	pingPong(t, ws)
	ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	got := tg.waitTimeline(t, "tl-ann", "start:started", "end:session-ended")
	if got[0].Segment != "vip" || got[0].Detail == "" {
		t.Errorf("start in segment %q, detail %q; want vip and which connection", got[0].Segment, got[0].Detail)
	}
	if got[1].Code != websocket.CloseNormalClosure {
		t.Errorf("end with code %d, want 1000", got[1].Code)
	}

	// A second device joins; a drop ends its connection, not the session.
	a := tg.dial(t, "tl-bob")
	// Its route written before the second connects: one write counting
	// both would find the user on two connections for each.
	tg.waitTimeline(t, "tl-bob", "start:started")
	b := tg.dial(t, "tl-bob")
	tg.waitTimeline(t, "tl-bob", "start:started", "start:joined")
	b.NetConn().Close()
	got = tg.waitTimeline(t, "tl-bob", "start:started", "start:joined", "end:dropped")
	if got[2].Code != websocket.CloseAbnormalClosure {
		t.Errorf("a drop's end with code %d, want 1006", got[2].Code)
	}
	a.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	tg.waitTimeline(t, "tl-bob", "start:started", "start:joined", "end:dropped", "end:session-ended")
}

// TestTimelineActivityTurns: a turn to us from the activity endpoint and
// a turn to the user from the activity topic are each a turn change; a
// repeated turn changes nothing and is not recorded.
func TestTimelineActivityTurns(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.ActivitySecret = activitySecret })
	post := func(body string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+tg.PushAddr().String()+activity.Path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+activitySecret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("activity: %s", resp.Status)
		}
	}
	post(events(`{"uid":"tl-cat","kind":"turn","to":"us"}`, `{"uid":"tl-cat","kind":"turn","to":"us"}`))
	refused, err := tg.activity.applyRecords(context.Background(), []*kgo.Record{
		{Key: []byte("tl-cat"), Value: []byte(`{"uid":"tl-cat","kind":"turn","to":"user"}`)},
	})
	if err != nil || len(refused) != 0 {
		t.Fatalf("activity topic: %v, %v", refused, err)
	}
	got := tg.waitTimeline(t, "tl-cat", "turn:us", "turn:user")
	if !strings.Contains(got[0].Detail, viaEndpoint) || !strings.Contains(got[1].Detail, viaTopic) {
		t.Errorf("details %q, %q: want the endpoint, then the topic", got[0].Detail, got[1].Detail)
	}
}

// TestTimelineAck: a device's ack of a guide it got is recorded; an ack
// of an id it never got is not.
func TestTimelineAck(t *testing.T) {
	tg := startGateway(t, nil)
	ws := tg.dial(t, "tl-dan")
	tg.waitTimeline(t, "tl-dan", "start:started")
	tg.mustPush(t, push.Request{ID: "g-ack", UID: "tl-dan", Text: "Still there?"}, push.Delivered)
	readGuide(t, ws, "g-ack")
	for _, id := range []string{"made-up", "g-ack"} {
		ws.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, `{"type":"ack","id":%q}`, id))
	}
	got := tg.waitTimeline(t, "tl-dan", "start:started", "acked:")
	if got[1].Event != "g-ack" {
		t.Errorf("acked %q, want g-ack", got[1].Event)
	}
}

// TestTimelineCloseStage: a close stage's guide closes the connection
// with 4000, which the timeline records as closed, and the session's end.
func TestTimelineCloseStage(t *testing.T) {
	tg := startGateway(t, nil)
	ws := tg.dial(t, "tl-eve")
	// Recorded once the route is written: a guide pushed meanwhile
	// reaches the connection, and its entries may come first.
	tg.waitTimeline(t, "tl-eve", "start:started")
	req := push.Request{ID: "g-close", UID: "tl-eve", Text: "Closing the chat", Stage: 2,
		Action: timeoutevent.ActionClose, Final: true}
	tg.mustPush(t, req, push.Delivered)
	readGuide(t, ws, "g-close")
	ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ack","id":"g-close"}`))
	got := tg.waitTimeline(t, "tl-eve", "start:started", "closed:inactive", "acked:", "end:session-ended")
	if c := got[1]; c.Code != frame.CloseInactive || c.Event != "g-close" || c.Stage != 2 {
		t.Errorf("closed %+v, want code 4000, event g-close, stage 2", c)
	}
	if got[3].Code != frame.CloseInactive {
		t.Errorf("end with code %d, want 4000", got[3].Code)
	}
}

// TestTimelinePushFromInbox: a guide kept for a user connected nowhere
// (the consumer records that) is recorded as sent once a connect hands it
// over.
func TestTimelinePushFromInbox(t *testing.T) {
	tg := startGateway(t, nil)
	tg.mustPush(t, push.Request{ID: "g-inbox", UID: "tl-fay", Text: "Still there?", Stage: 1}, push.Queued)
	ws := tg.dial(t, "tl-fay")
	readGuide(t, ws, "g-inbox")
	// Reading on answers the gateway's ping after the guide: the proof.
	go func() {
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
		}
	}()
	got := tg.waitTimeline(t, "tl-fay", "start:started", "sent:delivered")
	if s := got[1]; s.Event != "g-inbox" || s.Conns != 1 || !strings.Contains(s.Detail, "inbox") {
		t.Errorf("sent %+v, want g-inbox to 1 connection, from the inbox", s)
	}
}

// TestTimelineEntries: the gateway's entries, from their facts.
func TestTimelineEntries(t *testing.T) {
	if e, ok := turnEntry(activityActive, "", viaTopic); ok {
		t.Errorf("an active event is a turn: %+v", e)
	}
	for code, want := range map[int]string{1001: "shutting down", 4001: "token", 1013: "Redis", 1234: "by the gateway"} {
		if e := endEntry("", code, true, false, session.RouteResult{Left: 1}); e.Rule != ruleByGateway || !strings.Contains(e.Detail, want) {
			t.Errorf("gateway's close %d: %+v, want rule %s and %q", code, e, ruleByGateway, want)
		}
	}
	if e := startEntry("", 1, session.RouteResult{Err: context.DeadlineExceeded}, true); e.Rule != ruleConnected || !strings.Contains(e.Detail, "held") {
		t.Errorf("start with the route unwritten: %+v", e)
	}
	if _, ok := sentEntry(push.Request{ID: "x"}, push.Stale, 0, ""); ok {
		t.Error("a stale guide recorded as sent")
	}
}

// waitEntry waits until uid's timeline holds a kind:rule entry about
// guide id, and returns it.
func (tg *testGateway) waitEntry(t *testing.T, uid, kindRule, id string) timeline.Entry {
	t.Helper()
	var got []timeline.Entry
	var found timeline.Entry
	if !waitFor(patience, func() bool {
		var err error
		if got, err = timeline.Read(context.Background(), tg.store, uid, 0); err != nil {
			t.Fatal(err)
		}
		for _, e := range got {
			if string(e.Kind)+":"+e.Rule == kindRule && e.Event == id {
				found = e
				return true
			}
		}
		return false
	}) {
		t.Fatalf("%s's timeline: %s, want %s of %s", uid, timeline.Kinds(got), kindRule, id)
	}
	if found.Service != "gateway" {
		t.Errorf("%s recorded by %s, want the gateway", kindRule, found.Service)
	}
	return found
}

// TestTimelineInboxDrops: a guide kept in the inbox that is dropped at
// the user's connect, because they renewed after its deadline meanwhile,
// or because it expired before they came, is in their timeline as
// skipped, with why: the consumer's "sent: inbox" is not the end of it.
func TestTimelineInboxDrops(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.GuideMaxAge = 2 * time.Second })
	ctx := context.Background()

	deadline := redisNowMS(t, tg.rdb) - 500
	tg.mustPush(t, push.Request{ID: "g-back", UID: "tl-gus", Text: "Still there?", DeadlineMS: deadline, Stage: 1}, push.Queued)
	waitUntil(t, "Redis's clock past the keep", func() bool { return redisNowMS(t, tg.rdb) > deadline+500 })
	if _, err := tg.store.Renew(ctx, "tl-gus", "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	tg.dial(t, "tl-gus")
	if e := tg.waitEntry(t, "tl-gus", "skipped:came-back", "g-back"); !strings.Contains(e.Detail, "inbox") || e.Deadline != deadline {
		t.Errorf("came back: %+v, want the inbox named and the deadline", e)
	}

	old := redisNowMS(t, tg.rdb) - 1500
	tg.mustPush(t, push.Request{ID: "g-old", UID: "tl-hal", Text: "Still there?", DeadlineMS: old, Stage: 1}, push.Queued)
	fresh := redisNowMS(t, tg.rdb)
	tg.mustPush(t, push.Request{ID: "g-new", UID: "tl-hal", Text: "Still there?", DeadlineMS: fresh, Stage: 1}, push.Queued)
	// Real time must pass: the old guide's max age runs out by Redis's
	// clock, while the new one keeps the inbox.
	waitUntil(t, "the old guide's max age to run out", func() bool { return redisNowMS(t, tg.rdb) > old+2100 })
	ws := tg.dial(t, "tl-hal")
	readGuide(t, ws, "g-new")
	if e := tg.waitEntry(t, "tl-hal", "skipped:too-old", "g-old"); !strings.Contains(e.Detail, "expired") {
		t.Errorf("too old: %+v, want it said to have expired in the inbox", e)
	}
}

func TestDeviceOf(t *testing.T) {
	for _, tc := range []struct {
		name, query, ua, want, err string
	}{
		{name: "the device parameter", query: "device=phone-7.a:b_c", ua: "Mozilla/5.0", want: "phone-7.a:b_c"},
		{name: "else the User-Agent", ua: "Mozilla/5.0 (X11; Linux x86_64)", want: "Mozilla/5.0 (X11; Linux x86_64)"},
		{name: "a User-Agent's printable ASCII only", ua: "app\x01/1\u00e9.0", want: "app/1.0"},
		{name: "a long User-Agent cut", ua: strings.Repeat("x", 200), want: strings.Repeat("x", maxUserAgent)},
		{name: "neither", want: ""},
		{name: "a device too long", query: "device=" + strings.Repeat("d", maxDevice+1), err: "device: 65 characters"},
		{name: "a device with a space", query: "device=my+phone", err: "device: \"my phone\""},
		{name: "a device at the limit", query: "device=" + strings.Repeat("d", maxDevice), want: strings.Repeat("d", maxDevice)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/v1/ws?"+tc.query, nil)
			if tc.ua != "" {
				r.Header.Set("User-Agent", tc.ua)
			}
			got, err := deviceOf(r)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("deviceOf = %q, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("deviceOf = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestTimelineStartSaysDevice: a start says which device connected, and
// a malformed device parameter is refused before the upgrade, with 400.
func TestTimelineStartSaysDevice(t *testing.T) {
	tg := startGateway(t, nil)
	tok, err := token.Mint([]byte(tokenSecret), "tl-dev", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	url := "ws://" + tg.PublicAddr().String() + "/v1/ws"
	hdr := http.Header{"Authorization": {"Bearer " + tok}}
	ws, _, err := websocket.DefaultDialer.Dial(url+"?device=laptop-2", hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	got := tg.waitTimeline(t, "tl-dev", "start:started")
	if got[0].Device != "laptop-2" {
		t.Errorf("start of device %q, want laptop-2", got[0].Device)
	}
	_, resp, err := websocket.DefaultDialer.Dial(url+"?device=a%20b", hdr)
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a malformed device: %v, %v; want 400 before the upgrade", resp, err)
	}
}
