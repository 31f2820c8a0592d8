package gateway

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

// Attacks on keeping guides ahead of their live delivery, fourth round:
// the offers of the inbox the third round's fixes added (a handover's
// entries released as its connection ends, a held guide superseded), and
// what they still leave behind.

// TestAttackAhead4ReleaseOnOtherInstanceLeavesReconnectWithout is the
// third round's lease attack with the two devices on two gateway
// instances (one Redis, one prefix). Device A is live on instance one and
// is pushed guide g: kept ahead, queued on A, whose client reads nothing
// yet. Device B connects on instance two, and its connect is handed g's
// entry from the inbox: leased to B, queued on B, unread. A's network
// goes: A's hand-on routes g, and B (which has it) counts as delivered.
// A's device reconnects on instance one (A2), silent: its connect finds g
// leased to B and is handed nothing. Then B's network goes before it
// proved g: B's handover releases the lease, and the fix offers the
// inbox to the user's connections on instance two only, where there are
// none. Nothing offers it to A2: A2 stays connected, its user silent, and
// is never handed g, which waits for a connect that may not come.
func TestAttackAhead4ReleaseOnOtherInstanceLeavesReconnectWithout(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	long := func(c *Config) {
		// No connection is cut off for want of proof meanwhile: each
		// ends when the test ends it.
		c.WriteTimeout = 30 * time.Second
	}
	one := startGatewayOn(t, []string{srv.Addr}, prefix, long)
	two := startGatewayOn(t, []string{srv.Addr}, prefix, long)
	uid := "aa4-xlease"

	wsA := one.dial(t, uid)
	pingPong(t, wsA) // the user's last renewal, before the deadline
	g := push.Request{ID: "g", UID: uid, Text: "Still there?", DeadlineMS: redisNowMS(t, one.rdb), Stage: 1}
	if res := one.mustPush(t, g, push.Delivered); res.Connections != 1 {
		t.Fatalf("delivered to %d connections, want 1", res.Connections)
	}
	wsB := two.dial(t, uid) // its client reads nothing: no proof
	waitUntil(t, "B's connect leases g's entry", func() bool { return one.aaLeases(uid) == 1 })

	wsA.NetConn().Close() // A's network is gone before it proved g
	waitUntil(t, "A ends", func() bool { return one.hub.count(uid) == 0 })
	one.aa3HandedOn(t, uid, g.ID)

	// A's device reconnects on instance one; its connect's take is done
	// once the handler reaches its test hook.
	setup := make(chan struct{}, 1)
	one.testSetup = func() {
		select {
		case setup <- struct{}{}:
		default:
		}
	}
	wsA2 := one.dial(t, uid)
	select {
	case <-setup:
	case <-time.After(10 * time.Second):
		t.Fatal("A2's connect never got past its inbox take")
	}
	got := aa3Guides(wsA2) // A2's client reads (and answers pings), and says nothing

	wsB.NetConn().Close() // B's network is gone before it proved g
	waitUntil(t, "B ends and releases its lease", func() bool { return two.hub.count(uid) == 0 && one.aaLeases(uid) == 0 })

	handed := waitFor(5*time.Second, func() bool {
		select {
		case id := <-got:
			return id == g.ID
		default:
			return false
		}
	})
	if !handed {
		t.Errorf("A2, connected and silent on instance one, was never handed g (inbox %v, leases %d): B's handover on instance two leased the entry kept ahead and released it unproven, offering it only to instance two's connections; g waits for a connect that may not come",
			one.aaInboxIDs(t, uid), one.aaLeases(uid))
	}
}
