package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

// recorder is a msgHandler that records what its reader hands it, and
// stops reading at the message "stop", asking to linger.
type recorder struct {
	rd       *goReader
	mu       sync.Mutex
	messages []string
	closed   []error
	ended    chan struct{}
}

func (r *recorder) Message(typ int, data []byte) bool {
	r.mu.Lock()
	r.messages = append(r.messages, string(data))
	r.mu.Unlock()
	if string(data) == "stop" {
		r.rd.Linger(lingerTimeout)
		return false
	}
	return true
}

func (r *recorder) Closed(err error) {
	r.mu.Lock()
	r.closed = append(r.closed, err)
	r.mu.Unlock()
	close(r.ended) // a second call panics
}

// serveRecorded serves each connection with a goReader and a recorder,
// set up by setup, and hands the recorders on.
func serveRecorded(t *testing.T, setup func(*websocket.Conn)) (string, <-chan *recorder) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	recs := make(chan *recorder, 8)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		setup(ws)
		rec := &recorder{rd: &goReader{}, ended: make(chan struct{})}
		recs <- rec
		go func() {
			defer ws.Close()
			rec.rd.run(ws, rec)
		}()
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "ws://" + ln.Addr().String() + "/", recs
}

// TestGoReaderContract: the reader hands over messages in order, and ends
// with exactly one Closed: the peer's close, the read limit (the peer
// gets 1009 and the reader lingers), the read deadline (errIdle), or nil
// once Message stopped it, after a linger that drops what still comes
// and ends when the peer hangs up.
func TestGoReaderContract(t *testing.T) {
	url, recs := serveRecorded(t, func(ws *websocket.Conn) {
		ws.SetReadLimit(64)
		ws.SetReadDeadline(time.Now().Add(time.Hour))
	})
	dial := func(t *testing.T) (*websocket.Conn, *recorder) {
		t.Helper()
		ws, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.Close() })
		return ws, <-recs
	}
	ended := func(t *testing.T, rec *recorder) error {
		t.Helper()
		select {
		case <-rec.ended:
		case <-time.After(15 * time.Second):
			t.Fatal("Closed not called")
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.closed[0]
	}

	t.Run("peer close", func(t *testing.T) {
		ws, rec := dial(t)
		for _, m := range []string{"a", "b", "c"} {
			ws.WriteMessage(websocket.TextMessage, []byte(m))
		}
		ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
		var ce *websocket.CloseError
		if err := ended(t, rec); !errors.As(err, &ce) || ce.Code != websocket.CloseNormalClosure {
			t.Fatalf("Closed(%v), want the peer's 1000", err)
		}
		if got := fmt.Sprint(rec.messages); got != "[a b c]" {
			t.Fatalf("messages %s, want [a b c] in order", got)
		}
	})
	t.Run("stopped by Message, lingering", func(t *testing.T) {
		ws, rec := dial(t)
		ws.WriteMessage(websocket.TextMessage, []byte("stop"))
		ws.WriteMessage(websocket.TextMessage, []byte("dropped"))
		// The reader lingers until the peer hangs up.
		select {
		case <-rec.ended:
			t.Fatal("Closed before the linger ended")
		case <-time.After(50 * time.Millisecond):
		}
		ws.Close()
		if err := ended(t, rec); err != nil {
			t.Fatalf("Closed(%v), want nil after Message stopped reading", err)
		}
		if got := fmt.Sprint(rec.messages); got != "[stop]" {
			t.Fatalf("messages %s, want [stop]: nothing is handed over once stopped", got)
		}
	})
	t.Run("read limit", func(t *testing.T) {
		ws, rec := dial(t)
		ws.WriteMessage(websocket.TextMessage, make([]byte, 100))
		ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _, err := ws.ReadMessage()
		if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
			t.Fatalf("peer read %v, want close 1009", err)
		}
		ws.Close()
		if err := ended(t, rec); !errors.Is(err, websocket.ErrReadLimit) {
			t.Fatalf("Closed(%v), want ErrReadLimit", err)
		}
	})
	t.Run("idle", func(t *testing.T) {
		url, recs := serveRecorded(t, func(ws *websocket.Conn) {
			ws.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		})
		ws, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		if err := ended(t, <-recs); !errors.Is(err, errIdle) {
			t.Fatalf("Closed(%v), want errIdle", err)
		}
	})
}

// TestMessageDoesNotWaitForRedis: while Redis hangs (a paused
// redis-server), Message takes a ping without waiting for its renewal:
// on every one of many connections, a frame sent after the ping is
// answered before it. Once Redis runs again, every ping is answered.
func TestMessageDoesNotWaitForRedis(t *testing.T) {
	srv := redistest.Start(t)
	tg := startGatewayOn(t, []string{srv.Addr}, redistest.Prefix(t), nil)
	const n = 40
	conns := make([]*websocket.Conn, n)
	for i := range conns {
		conns[i] = tg.dial(t, fmt.Sprintf("still-%02d", i))
		pingPong(t, conns[i])
	}

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	for _, ws := range conns {
		ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
		ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"what"}`))
	}
	// A reader that waited for the renewal would answer the ping first,
	// once its round trip to the paused server failed or came back.
	for i, ws := range conns {
		if m := readJSON(t, ws); m["type"] != "error" || m["code"] != frame.CodeUnknownType {
			t.Fatalf("connection %d answered %v first, want the unknown frame's error: the ping held up its reader", i, m)
		}
	}

	srv.Resume()
	resumed = true
	for i, ws := range conns {
		ws.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, b, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("connection %d: the ping's answer: %v", i, err)
		}
		if s := string(b); !(strings.Contains(s, `"type":"pong"`) || strings.Contains(s, `"code":"`+frame.CodeUnavailable+`"`)) {
			t.Fatalf("connection %d answered the ping with %s, want a pong or the store's unavailability", i, s)
		}
	}
}
