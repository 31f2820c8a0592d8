// Review round 3. Package: pkg/expiry (file pkg/expiry/attack3_segments_test.go).
// Run: go test -race -count=1 -run 'TestAttack3ShortSegmentDeviceShortensSession' -v ./pkg/expiry/
// Shows: a user's two devices in two segments (tokens carry the segment): the short-TTL device's
// ping rewrites the deadline to now+its TTL, cutting the grant the long-TTL device was just given;
// the user is guided on both devices 2s after the phone was granted 12s.
// Seen failing (4 of 4 runs):
//   DEFECT: a timeout for the user 2.008s after the phone's ping, which was granted 12s: the web tab's later
//   ping (2s TTL) cut the phone's grant, and the user is guided on both devices

package expiry

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/token"
)

// dialSegment connects uid to g with a token naming segment.
func dialSegment(t *testing.T, g *attackGateway, uid, segment string) *websocket.Conn {
	t.Helper()
	tok, err := token.Mint([]byte(attackTokenSecret), uid, segment, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+g.PublicAddr().String()+"/v1/ws",
		http.Header{"Authorization": {"Bearer " + tok}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// pongTTL pings on ws and returns the ttl_ms of the pong.
func pongTTL(t *testing.T, ws *websocket.Conn) time.Duration {
	t.Helper()
	ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
	ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	var f struct {
		Type  string `json:"type"`
		TTLMS int64  `json:"ttl_ms"`
	}
	if err := ws.ReadJSON(&f); err != nil || f.Type != "pong" {
		t.Fatalf("ping answered with %+v, %v", f, err)
	}
	ws.SetReadDeadline(time.Time{})
	return time.Duration(f.TTLMS) * time.Millisecond
}

// waitGranted pings on ws until a pong grants at least want, and returns
// when that ping was sent and what it was granted: until a gateway has
// read the policy (it refreshes every 100ms) a ping is granted the
// default TTL. It pings at most ten times a second, well within the rate
// limit.
func waitGranted(t *testing.T, ws *websocket.Conn, want time.Duration) (sent time.Time, granted time.Duration) {
	t.Helper()
	waitFor(t, waitLong, fmt.Sprintf("a ping granted %v", want), func() bool {
		if time.Since(sent) < 100*time.Millisecond {
			return false
		}
		sent = time.Now()
		granted = pongTTL(t, ws)
		return granted >= want
	})
	return sent, granted
}

// TestAttack3ShortSegmentDeviceShortensSession: "A user is present while
// any of their connections pings" (docs/protocol.md), and "Each ping
// grants the session STILLTHERE_SESSION_TTL [of the segment]". A token
// carries the segment, so one user's two devices may be in two segments
// (a platform that gives its mobile app a longer TTL, as it pings less
// often to save battery). The renewal script writes now+ttl whatever
// deadline the session already has: a ping from the device with the
// short TTL cuts the grant the other device was just given, and the user
// is guided on both devices while the long-TTL device's grant (its pong's
// ttl_ms) still runs.
func TestAttack3ShortSegmentDeviceShortensSession(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.savePolicy(policy.Policy{
		DefaultTTL: 2 * time.Second,
		Segments:   map[string]time.Duration{"mobile": 12 * time.Second},
	})
	h.start(h.config(ModeSweep))
	g := h.startAttackGateway(h.srv.Addr, 2*time.Second, nil)

	phone := dialSegment(t, g, "multi", "mobile")
	web := dialSegment(t, g, "multi", "default")
	// The phone is in use, granted the mobile segment's 12s once the
	// gateway has read the policy.
	start, phoneGrant := waitGranted(t, phone, 10*time.Second)
	pongTTL(t, web) // a glance at the web tab a moment later: 2s
	// Nothing more from either device. By the phone's grant the user is
	// there until start+12s: the first timeout of the user must not come
	// before, and is the mobile segment's.
	waitFor(t, waitLong, "the user's timeout", func() bool { return len(byUID(h.events())["multi"]) > 0 })
	ev := byUID(h.events())["multi"][0]
	if ev.DeadlineMS < start.Add(phoneGrant).UnixMilli() {
		t.Fatalf("DEFECT: a timeout for the user %v after the phone's ping, which was granted %v: "+
			"the web tab's later ping (2s TTL) cut the phone's grant, and the user is guided on both devices "+
			"(deadline %s, phone's grant ran to %s)",
			time.UnixMilli(ev.DeadlineMS).Sub(start).Round(time.Millisecond), phoneGrant,
			time.UnixMilli(ev.DeadlineMS).Format("15:04:05.000"), start.Add(phoneGrant).Format("15:04:05.000"))
	}
	if ev.Segment != "mobile" {
		t.Fatalf("the timeout at the phone's deadline is of segment %q, want mobile: its grant ran out", ev.Segment)
	}
}
