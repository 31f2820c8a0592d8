package gateway

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestProtocolPingsOnlyToQuietClients: the gateway pings a connection only
// once its client has been quiet for most of the idle timeout. A client
// that sends frames of its own more often is never pinged; a silent one
// is, answers, and stays open, as does the talker.
func TestProtocolPingsOnlyToQuietClients(t *testing.T) {
	const idle = 3 * time.Second
	tg := startGateway(t, func(c *Config) { c.IdleTimeout = idle })
	type client struct {
		ws    *websocket.Conn
		pings atomic.Int32 // protocol pings from the gateway
		ended chan error
	}
	open := func(uid string) *client {
		cl := &client{ws: tg.dial(t, uid), ended: make(chan error, 1)}
		cl.ws.SetPingHandler(func(data string) error {
			cl.pings.Add(1)
			return cl.ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
		})
		go func() {
			for {
				if _, _, err := cl.ws.ReadMessage(); err != nil {
					cl.ended <- err
					return
				}
			}
		}()
		return cl
	}
	talker, quiet := open("talker"), open("quiet")
	// The talker pings every tenth of the timeout, over 8/3 of it: the
	// cadence is what is tested, not a wait for something. The quiet
	// client is pinged by then about every 0.8-0.9 of it: twice or more.
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); {
		if err := talker.ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
			t.Fatalf("talker's ping: %v", err)
		}
		select {
		case err := <-talker.ended:
			t.Fatalf("the talker's connection ended: %v", err)
		case err := <-quiet.ended:
			t.Fatalf("the quiet client's connection ended, though it answered every ping: %v", err)
		case <-time.After(idle / 10):
		}
	}
	// A ping to the talker would take it being unheard from for 0.8 of the
	// timeout (2.4 s); one is allowed for a host that starved the test
	// that long. Pinged regardless, as every connection was every 0.9 of
	// the timeout, it would have had two or three.
	if n := talker.pings.Load(); n > 1 {
		t.Errorf("the talker, heard from every %v, got %d protocol pings; want none", idle/10, n)
	}
	if n := quiet.pings.Load(); n < 2 {
		t.Errorf("the quiet client got %d protocol pings in 8s under a %v idle timeout; want 2 or more", n, idle)
	}
	if len(tg.hub.lookup("talker")) != 1 || len(tg.hub.lookup("quiet")) != 1 {
		t.Error("a client that was heard from within the idle timeout was dropped")
	}
}
