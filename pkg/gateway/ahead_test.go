package gateway

import (
	"context"
	"slices"
	"testing"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// TestGuideOutlivesGatewayDeadBeforeProof: a push answered delivered
// leaves the guide waiting on the user's connection for its client's
// proof. The gateway holding it dies first, as a SIGKILL or an OOM kills
// it: it cannot reach Redis again, so it hands nothing on. The consumer
// heard delivered and is done; the guide must not be lost with the
// process: the user's next connect, on another instance, is handed it.
// (Before the guide was kept ahead of its delivery, nothing held it but
// the dead process.) And a guide proven on a connection leaves the inbox
// it was kept in: a later connect is not handed it.
func TestGuideOutlivesGatewayDeadBeforeProof(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	cut, err := tcpproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cut.Close() })
	dying := startGatewayOn(t, []string{cut.Addr()}, prefix, nil)
	other := startGatewayOn(t, []string{srv.Addr}, prefix, nil)
	ctx := context.Background()
	ks := other.store.Keyspace()

	// Proven: out of the inbox.
	ws := other.dial(t, "pia")
	pingPong(t, ws)
	proven := push.Request{ID: "p1", UID: "pia", Text: "Are you still there?", DeadlineMS: redisNowMS(t, other.rdb)}
	other.mustPush(t, proven, push.Delivered)
	readGuide(t, ws, proven.ID)
	pingPong(t, ws) // reading answered the gateway's ping: proof
	waitUntil(t, "the proven guide leaves the inbox", func() bool { return other.rdb.LLen(ctx, ks.InboxKey("pia")).Val() == 0 })

	// Not proven when its gateway dies.
	ws = dying.dial(t, "uma")
	pingPong(t, ws)
	req := push.Request{ID: "u1", UID: "uma", Text: "Are you still there?", DeadlineMS: redisNowMS(t, other.rdb)}
	if res := dying.mustPush(t, req, push.Delivered); res.Connections != 1 {
		t.Fatalf("delivered to %d connections, want 1", res.Connections)
	}
	// The client does not read: neither the guide nor the ping after it
	// is answered. Then the process dies: its Redis is gone, and so is
	// its client's connection.
	cut.Cut()
	dying.run.Tolerate()
	ws.NetConn().Close()
	waitUntil(t, "the dead gateway's connection ends", func() bool { return dying.hub.count("uma") == 0 })

	again := other.dial(t, "uma")
	readGuide(t, again, req.ID)
	pingPong(t, again) // and only once
	waitUntil(t, "the guide leaves the inbox once proven", func() bool { return other.rdb.LLen(ctx, ks.InboxKey("uma")).Val() == 0 })
}

// TestAckProvesItsFirstCopy: a connection may hold two copies of a guide
// (a live one and one from the inbox, when more guides than it remembers
// came between). A client reads in order, so an ack of the id proves its
// first copy waiting, and what was queued before it: never a guide queued
// after it, which the client may not have read. And an ack of an id whose
// first copy was proven already (its pong came first) proves no more.
func TestAckProvesItsFirstCopy(t *testing.T) {
	var proven []string
	c := &conn{}
	c.mu.Lock()
	for _, id := range []string{"g1", "g2", "g1", "g2"} {
		c.awaitingFrom(&guideProof{id: id, proven: func() { proven = append(proven, id) }})
	}
	c.mu.Unlock()
	c.ackProof("g1")
	if !slices.Equal(proven, []string{"g1"}) {
		t.Fatalf("an ack of g1 proved %v, want the first g1 only", proven)
	}
	c.ackProof("g1")
	if !slices.Equal(proven, []string{"g1"}) {
		t.Fatalf("a second ack of g1 proved %v, want nothing more: its first copy was proven", proven)
	}
	c.ackProof("g2")
	if !slices.Equal(proven, []string{"g1", "g2"}) {
		t.Fatalf("an ack of g2 proved %v, want g1 and the first g2", proven)
	}
}
