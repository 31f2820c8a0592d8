package devstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// watcher reads one connection on a goroutine of its own, the only
// reader: it keeps the guides that arrive, with when, and hands pongs to
// ping, so a test can ping and watch for guides on one connection.
type watcher struct {
	ws    *websocket.Conn
	pongs chan guideFrame
	done  chan struct{} // closed when the read side ends

	mu     sync.Mutex
	guides []seenGuide
	err    error // what ended the read side
}

// seenGuide is a guide frame and when it arrived.
type seenGuide struct {
	guideFrame
	at time.Time
}

func (g seenGuide) String() string {
	return fmt.Sprintf("guide %s for deadline %s at %s", g.ID,
		time.UnixMilli(g.DeadlineMS).Format(time.StampMilli), g.at.Format(time.StampMilli))
}

// watch starts reading ws; at cleanup the connection is closed and the
// reader waited for.
func watch(t *testing.T, ws *websocket.Conn) *watcher {
	w := &watcher{ws: ws, pongs: make(chan guideFrame, 8), done: make(chan struct{})}
	go w.read()
	t.Cleanup(func() {
		ws.Close()
		<-w.done
	})
	return w
}

func (w *watcher) read() {
	defer close(w.done)
	for {
		_, b, err := w.ws.ReadMessage()
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		var f guideFrame
		if json.Unmarshal(b, &f) != nil {
			continue // the contract tests judge frames; these count guides
		}
		switch f.Type {
		case "guide":
			w.mu.Lock()
			w.guides = append(w.guides, seenGuide{f, time.Now()})
			w.mu.Unlock()
		case "pong":
			select {
			case w.pongs <- f:
			default: // nobody pinged: drop it
			}
		}
	}
}

// ping sends a ping and returns the bounds of the deadline its pong
// proves.
func (w *watcher) ping(t *testing.T) (low, high time.Time) {
	t.Helper()
	low, high, err := w.tryPing()
	if err != nil {
		t.Fatal(err)
	}
	return low, high
}

// tryPing is ping for a goroutine other than the test's.
func (w *watcher) tryPing() (low, high time.Time, err error) {
	sent := time.Now()
	w.ws.SetWriteDeadline(sent.Add(time.Second))
	if err := w.ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
		return low, high, fmt.Errorf("ping: %w", err)
	}
	select {
	case f := <-w.pongs:
		ttl := time.Duration(f.TTLMS) * time.Millisecond
		return sent.Add(ttl), time.Now().Add(ttl), nil
	case <-w.done:
		return low, high, fmt.Errorf("connection ended before the pong: %v", w.readErr())
	case <-time.After(5 * time.Second):
		return low, high, errors.New("no pong within 5s")
	}
}

// closeNormally closes with 1000 and waits for the gateway's answer.
func (w *watcher) closeNormally(t *testing.T) {
	t.Helper()
	w.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(time.Second))
	select {
	case <-w.done:
		if err := w.readErr(); !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
			t.Errorf("normal close answered with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("no answer to a normal close within 5s")
	}
	w.ws.Close()
}

func (w *watcher) readErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// seen returns the guides that arrived so far.
func (w *watcher) seen() []seenGuide {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]seenGuide(nil), w.guides...)
}
