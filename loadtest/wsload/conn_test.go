package main

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"
)

func TestPongLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLoad(15 * time.Second)
		c := &conn{l: l}
		l.live.Add(1)
		pong := []byte(`{"type":"pong","ttl_ms":60000,"deadline_ms":1}`)

		c.Message(websocket.TextMessage, pong) // none outstanding: counted, not timed
		time.Sleep(time.Second)
		c.sent.Store(time.Since(l.start).Nanoseconds())
		time.Sleep(3 * time.Millisecond)
		c.Message(websocket.TextMessage, pong)
		c.Message(websocket.TextMessage, pong) // a second pong times nothing
		c.Message(websocket.TextMessage, []byte(`{"type":"guide","id":"g1"}`))
		c.Message(websocket.TextMessage, []byte(`{"type":"guide","id":"g1"}`))
		c.Message(websocket.TextMessage, []byte(`not json`))

		h := l.mark()
		if n := h.Count(); n != 1 {
			t.Fatalf("%d pongs timed, want 1", n)
		}
		// 3 ms is in the bucket [2976, 3007] µs.
		if got := h.Quantile(0.5); got < 3*time.Millisecond || got > 3007*time.Microsecond {
			t.Errorf("ping→pong %v, want 3 ms", got)
		}
		if l.pongs.Load() != 3 || l.guides.Load() != 2 || l.distinctGuides() != 1 {
			t.Errorf("pongs %d, guides %d, distinct %d; want 3, 2, 1", l.pongs.Load(), l.guides.Load(), l.distinctGuides())
		}
		if l.latency.Load().Count() != 0 {
			t.Error("the histogram after a mark is not empty")
		}

		c.Closed(nil)
		if l.closed.Load() != 1 {
			t.Errorf("closed %d after the gateway ended it, want 1", l.closed.Load())
		}
		d := &conn{l: l}
		l.live.Add(1)
		l.leaving.Store(true)
		d.Closed(nil)
		if l.closed.Load() != 1 {
			t.Errorf("closed %d after our own leaving, want still 1", l.closed.Load())
		}
	})
}
