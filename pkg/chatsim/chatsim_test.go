package chatsim

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// gateway answers a connection's first ping with a pong granting grant
// and every later one "session store unavailable".
func gateway(t *testing.T, grant time.Duration) string {
	t.Helper()
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		for n := 0; ; n++ {
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
			answer := `{"type":"error","code":"unavailable"}`
			if n == 0 {
				answer = `{"type":"pong","ttl_ms":` + strings.TrimSuffix(grant.String(), "ms") + `}`
			}
			if ws.WriteMessage(websocket.TextMessage, []byte(answer)) != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

func TestUserRecordsWhatAnswersProve(t *testing.T) {
	const grant = 900 * time.Millisecond
	url := gateway(t, grant)
	for _, grants := range []bool{false, true} {
		var readers sync.WaitGroup
		u := &User{UID: "u", Token: "tok", TTL: time.Second, Jitter: 100 * time.Millisecond,
			UnavailableGrants: grants, Readers: &readers}
		if c := u.Dial(context.Background(), func(int) (string, bool) { return "", false }); c != nil {
			t.Fatal("dialled with no gateway to try")
		}
		c := u.Dial(context.Background(), func(n int) (string, bool) { return url, n == 2 })
		if c == nil {
			t.Fatal("dial failed")
		}
		before := time.Now()
		if err := c.Ping(false); err != nil {
			t.Fatal(err)
		}
		if err := c.Ping(true); err != nil {
			t.Fatal(err)
		}
		after := time.Now()
		c.Drop() // returns once both pings are answered
		readers.Wait()

		r := u.Record()
		if r.Dials != 2 || r.FailedDials != 1 || r.Pings != 2 || r.Pongs != 1 || r.Unavailable != 1 || r.LateSelf != 0 {
			t.Errorf("grants %v: record %+v", grants, r)
		}
		if r.Low.Before(before.Add(grant)) || r.Low.After(after.Add(u.TTL)) {
			t.Errorf("grants %v: low %v not in [%v, %v]", grants, r.Low, before.Add(grant), after.Add(u.TTL))
		}
		// The unavailable answer proves send+TTL only when it grants.
		if got := !r.Low.Before(before.Add(u.TTL)); got != grants {
			t.Errorf("grants %v: low %v reaches the second ping's TTL: %v", grants, r.Low.Sub(before), got)
		}
		if r.High.Before(before.Add(u.TTL + u.Jitter)) {
			t.Errorf("grants %v: high %v below the last ping's longest grant", grants, r.High.Sub(before))
		}
	}
}
