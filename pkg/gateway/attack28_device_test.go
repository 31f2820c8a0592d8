package gateway

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/token"
)

// TestAttack28ClientsConnectWithoutDevice: the device parameter breaks no
// client that does not send it. The web client connects with its token
// in the query (and first=ping after an offline spell), the k6 scripts
// with a bearer header and a query the operator may leave in the URL; an
// empty device parameter reads as none. Each connects, and its start
// names the User-Agent.
func TestAttack28ClientsConnectWithoutDevice(t *testing.T) {
	tg := startGateway(t, nil)
	base := "ws://" + tg.PublicAddr().String() + "/v1/ws"
	for _, c := range []struct {
		name, uid string
		query     func(tok string) url.Values
		bearer    bool
	}{
		{name: "web client", uid: "a28-web", query: func(tok string) url.Values { return url.Values{"token": {tok}} }},
		{name: "web client, first ping", uid: "a28-first", query: func(tok string) url.Values {
			return url.Values{"token": {tok}, "first": {"ping"}}
		}},
		{name: "k6, bearer", uid: "a28-k6", bearer: true, query: func(string) url.Values { return url.Values{} }},
		{name: "empty device", uid: "a28-empty", query: func(tok string) url.Values { return url.Values{"token": {tok}, "device": {""}} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok, err := token.Mint([]byte(tokenSecret), c.uid, "", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			hdr := http.Header{"User-Agent": {"a28-agent/1.0"}}
			if c.bearer {
				hdr.Set("Authorization", "Bearer "+tok)
			}
			u := base
			if q := c.query(tok); len(q) > 0 {
				u += "?" + q.Encode()
			}
			ws, resp, err := websocket.DefaultDialer.Dial(u, hdr)
			if err != nil {
				t.Fatalf("dial: %v (%v)", err, resp)
			}
			defer ws.Close()
			got := tg.waitTimeline(t, c.uid, "start:started")
			if got[0].Device != "a28-agent/1.0" {
				t.Errorf("start device %q, want the User-Agent", got[0].Device)
			}
		})
	}
}
