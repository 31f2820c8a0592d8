package chatsim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
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

// serve runs a WebSocket server whose connections handler serves, and
// returns its ws:// URL.
func serve(t *testing.T, handler func(ws *websocket.Conn)) string {
	t.Helper()
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		handler(ws)
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

func connect(t *testing.T, u *User, url string) *Conn {
	t.Helper()
	c, err := u.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		<-c.Gone()
	})
	return c
}

// A ping given up on keeps its place: its late answer is not taken for
// the next ping's. Frames that answer no ping are kept in order.
func TestConnAnswersPingsInLineAndKeepsFrames(t *testing.T) {
	release := make(chan struct{})
	url := serve(t, func(ws *websocket.Conn) {
		ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"guide","id":"g1","text":"Still there?","deadline_ms":1000,"stage":1}`))
		for n := 1; ; n++ {
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
			if n == 1 {
				<-release // the first ping's answer comes late
				ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"error","code":"unknown_type"}`))
			}
			answer := `{"type":"pong","ttl_ms":` + strconv.Itoa(n*1000) + `}`
			if ws.WriteMessage(websocket.TextMessage, []byte(answer)) != nil {
				return
			}
		}
	})
	u := &User{UID: "u", TTL: time.Second}
	c := connect(t, u, url)
	if _, err := c.PingWait(time.Millisecond); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("first ping: %v, want %v", err, ErrNoAnswer)
	}
	close(release)
	a, err := c.PingWait(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if a.TTL != 2*time.Second || a.Unavailable || a.At.Before(a.Sent) || !a.High().Equal(a.At.Add(a.TTL)) {
		t.Fatalf("second ping answered %+v, want its own pong of 2s", a)
	}
	f, err := c.Next(5 * time.Second)
	if err != nil || f.Type != "guide" || f.ID != "g1" || f.Stage != 1 || f.At.IsZero() {
		t.Fatalf("first frame %+v, %v; want the guide", f, err)
	}
	if f, err = c.Next(5 * time.Second); err != nil || f.Type != "error" || f.Code != "unknown_type" {
		t.Fatalf("second frame %+v, %v; want the error", f, err)
	}
	if _, err = c.Next(time.Millisecond); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("third frame: %v, want none", err)
	}
	if gs := c.Guides(); len(gs) != 1 || gs[0].ID != "g1" {
		t.Fatalf("guides %v", gs)
	}
	if r := u.Record(); r.Pings != 2 || r.Pongs != 2 || r.Guides != 1 || !r.Low.Equal(a.Low()) {
		t.Fatalf("record %+v; want 2 pings, 2 pongs, 1 guide, low %v", r, a.Low())
	}
}

func TestConnEnds(t *testing.T) {
	t.Run("leave is answered", func(t *testing.T) {
		url := serve(t, func(ws *websocket.Conn) {
			for {
				if _, _, err := ws.ReadMessage(); err != nil {
					return // the default close handler answered with 1000
				}
			}
		})
		c := connect(t, &User{UID: "u"}, url)
		if err := c.Leave(5 * time.Second); err != nil {
			t.Fatalf("leave: %v", err)
		}
	})
	t.Run("closed by the gateway", func(t *testing.T) {
		url := serve(t, func(ws *websocket.Conn) {
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"guide","id":"g","final":true}`))
			ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(4000, "inactive"), time.Now().Add(time.Second))
			ws.ReadMessage()
		})
		c := connect(t, &User{UID: "u"}, url)
		f, err := c.Next(5 * time.Second)
		if err != nil || !f.Final {
			t.Fatalf("frame %+v, %v; want the final guide", f, err)
		}
		if _, err := c.Next(5 * time.Second); !websocket.IsCloseError(err, 4000) {
			t.Fatalf("after the last frame: %v, want the close", err)
		}
		if c.CloseCode() != 4000 || c.GoneAt().IsZero() || !c.IsGone() {
			t.Fatalf("close code %d, gone at %v", c.CloseCode(), c.GoneAt())
		}
	})
	t.Run("refused", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Origin") != "https://chat.example" || r.Header.Get("Authorization") != "" {
				http.Error(w, "wrong header", http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":"no token"}`))
		}))
		t.Cleanup(srv.Close)
		u := &User{UID: "u", Header: http.Header{"Origin": {"https://chat.example"}}}
		_, err := u.Connect(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"))
		var refused *RefusedError
		if !errors.As(err, &refused) || refused.Status != http.StatusUnauthorized || string(refused.Body) != `{"error":"no token"}` {
			t.Fatalf("connect: %v, want refused with 401 and its body", err)
		}
		if r := u.Record(); r.Dials != 1 || r.FailedDials != 1 {
			t.Fatalf("record %+v", r)
		}
	})
	// A frozen connection answers neither a protocol ping nor the close:
	// the gateway's read ends with the connection, no close frame in it.
	for _, frozen := range []bool{false, true} {
		t.Run(fmt.Sprintf("frozen %v", frozen), func(t *testing.T) {
			type seen struct {
				pong bool
				err  error
			}
			got := make(chan seen, 1)
			url := serve(t, func(ws *websocket.Conn) {
				var s seen
				ws.SetPongHandler(func(string) error { s.pong = true; return nil })
				if _, _, err := ws.ReadMessage(); err != nil { // the client is ready
					return
				}
				ws.WriteControl(websocket.PingMessage, []byte("proof"), time.Now().Add(time.Second))
				ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, ""), time.Now().Add(time.Second))
				_, _, s.err = ws.ReadMessage()
				got <- s
			})
			c := connect(t, &User{UID: "u"}, url)
			if frozen {
				c.Freeze()
			}
			// Frozen before the gateway pings: it waits for this.
			if err := c.WriteRaw(websocket.TextMessage, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			<-c.Gone()
			if c.CloseCode() != websocket.CloseGoingAway {
				t.Fatalf("ended with %v, want 1001", c.Err())
			}
			c.Close()
			s := <-got
			answered := s.pong || websocket.IsCloseError(s.err, websocket.CloseGoingAway)
			if answered == frozen {
				t.Fatalf("frozen %v: the gateway saw a pong %v, and its read ended with %v", frozen, s.pong, s.err)
			}
		})
	}
}

// A timed ping sent past the deadline the latest ping was answered with
// is the user's own lapse, recorded with that deadline; while the latest
// ping waits for its answer, none is.
func TestTimedPingPastToldDeadlineIsOwnLapse(t *testing.T) {
	past1 := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	past2 := past1.Add(100 * time.Millisecond)
	release := make(chan struct{})
	url := serve(t, func(ws *websocket.Conn) {
		for n := 1; ; n++ {
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
			deadline := time.Now().Add(time.Hour)
			switch n {
			case 1:
				deadline = past1
			case 2:
				deadline = past2
			case 3:
				<-release // the third ping's answer comes late
			}
			answer := fmt.Sprintf(`{"type":"pong","ttl_ms":1000,"deadline_ms":%d}`, deadline.UnixMilli())
			if ws.WriteMessage(websocket.TextMessage, []byte(answer)) != nil {
				return
			}
		}
	})
	u := &User{UID: "u", TTL: time.Second}
	c := connect(t, u, url)
	if _, err := c.PingWait(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(true); err != nil {
		t.Fatal(err)
	}
	if r := u.Record(); r.LateSelf != 1 || len(r.Missed) != 1 || !r.Missed[0].Equal(past1) {
		t.Fatalf("after a timed ping past the told deadline: late %d, missed %v; want 1, [%v]", r.LateSelf, r.Missed, past1)
	}
	for deadline := time.Now().Add(5 * time.Second); u.Record().Pongs < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the second ping was not answered")
		}
		time.Sleep(time.Millisecond) // a poll
	}
	if err := c.Ping(false); err != nil { // answered late
		t.Fatal(err)
	}
	if err := c.Ping(true); err != nil {
		t.Fatal(err)
	}
	close(release)
	if r := u.Record(); r.LateSelf != 1 || len(r.Missed) != 1 {
		t.Fatalf("a timed ping while the latest waits for its answer: late %d, missed %v; want it not counted", r.LateSelf, r.Missed)
	}
}

// TestFreshTokenForConnAndRedials: Auth hands a lasting connection a
// fresh token in an auth frame, and SetToken gives it to the dials after,
// as a client does before its token runs out.
func TestFreshTokenForConnAndRedials(t *testing.T) {
	var mu sync.Mutex
	var dialed, authed []string
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		dialed = append(dialed, r.Header.Get("Authorization"))
		mu.Unlock()
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			mu.Lock()
			authed = append(authed, string(b))
			mu.Unlock()
			ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"auth_ok"}`))
		}
	}))
	t.Cleanup(srv.Close)
	url := "ws" + strings.TrimPrefix(srv.URL, "http")

	u := &User{UID: "u", Token: "first", TTL: time.Second}
	c := connect(t, u, url)
	u.SetToken("second")
	if err := c.Auth("second"); err != nil {
		t.Fatal(err)
	}
	if f, err := c.Next(5 * time.Second); err != nil || f.Type != "auth_ok" {
		t.Fatalf("answer to the auth frame: %+v, %v", f, err)
	}
	connect(t, u, url)
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"Bearer first", "Bearer second"}; fmt.Sprint(dialed) != fmt.Sprint(want) {
		t.Errorf("dials sent %q, want %q", dialed, want)
	}
	if want := []string{`{"type":"auth","token":"second"}`}; fmt.Sprint(authed) != fmt.Sprint(want) {
		t.Errorf("the connection was sent %q, want %q", authed, want)
	}
}
