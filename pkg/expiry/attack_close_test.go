package expiry

import (
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// closeNormally ends p's connection with a normal close (1000): the user
// leaving on purpose, after which no guide may follow.
func closeNormally(t *testing.T, p *pinger) {
	t.Helper()
	p.cancel()
	<-p.done
	p.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"),
		time.Now().Add(time.Second))
	time.Sleep(200 * time.Millisecond) // the gateway reads it and answers
	p.ws.Close()
}

// TestAttackNormalCloseDuringOutageIsGuided: a user closes the app
// normally (1000) while their gateway cannot reach Redis. The gateway's
// End fails and is never tried again: the resync after the outage only
// re-ends connections still open. The session, left in Redis, lapses; it
// is held for the grace like any deadline near the outage, and then
// produced: a guide to a user who left on purpose, which a normal close
// promises never happens.
func TestAttackNormalCloseDuringOutageIsGuided(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const ttl = 2 * time.Second
	proxy, err := tcpproxy.Start(h.srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	gw := h.startAttackGateway(proxy.Addr(), ttl, nil)
	stop := h.start(h.config(ModeSweep))
	defer stop()

	leaver := startPinger(t, gw, "leaver", ttl/4)
	stayer := startPinger(t, gw, "stayer", ttl/4)
	time.Sleep(700 * time.Millisecond)
	proxy.Cut()
	time.Sleep(300 * time.Millisecond)
	closeNormally(t, leaver)
	time.Sleep(3 * time.Second)
	proxy.Restore()
	time.Sleep(ttl + testGrace + 2*time.Second)
	stayer.stop()
	stop()

	got := byUID(h.events())
	if evs := got["leaver"]; len(evs) > 0 {
		t.Errorf("leaver closed normally (1000) during the outage, yet got %d timeout event(s), deadline %v",
			len(evs), time.UnixMilli(evs[0].DeadlineMS).Format("15:04:05.000"))
	}
	if evs := got["stayer"]; len(evs) > 0 {
		t.Errorf("stayer kept pinging: %d timeout event(s)", len(evs))
	}
}
