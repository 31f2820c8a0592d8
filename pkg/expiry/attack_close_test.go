package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/session"
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
	// The gateway reads it and answers with its own close, which ends the
	// pinger's reader.
	waitFor(t, waitLong, "the gateway to answer the close", func() bool {
		select {
		case <-p.read:
			return true
		default:
			return false
		}
	})
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
	waitPongs(t, 2, leaver, stayer)
	// The cut closes the gateway's connections at once, and every new one:
	// the close comes in the outage.
	proxy.Cut()
	closeNormally(t, leaver)
	// The outage lasts past the leaver's last deadline, which the gateway
	// can no longer move.
	ms, err := h.rdb.ZScore(context.Background(), h.store.Keyspace().IndexKey(session.Bucket("leaver")), "leaver").Result()
	if err != nil {
		t.Fatalf("leaver has no deadline: %v", err)
	}
	h.untilRedis(time.UnixMilli(int64(ms)).Add(1500 * time.Millisecond))
	proxy.Restore()
	// Everyone's last grant runs out, and the grace after the outage
	// passes: a guide for the leaver would be out by then.
	h.sweptPast(h.redisNow().Add(ttl + testGrace))
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
