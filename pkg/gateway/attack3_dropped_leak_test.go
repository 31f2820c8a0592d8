// Review round 3. Package: pkg/gateway (file pkg/gateway/attack3_dropped_leak_test.go).
// Run: go test -race -count=1 -run 'TestAttack3DroppedGrantsNeverForgotten' -v ./pkg/gateway/
// Shows: the grants of dropped connections are forgotten only by a resync; on a healthy gateway
// the map keeps one entry per distinct user whose connection ever dropped.
// Seen failing (deterministic):
//   DEFECT: 50 of 50 dropped connections' grants are still held 5s after they ran out, on a gateway with no
//   outage: only a resync forgets them

package gateway

import (
	"fmt"
	"testing"
	"time"
)

// TestAttack3DroppedGrantsNeverForgotten: the gateway remembers the last
// grant of every connection that ended without a normal close (dropped.go),
// "until the grant runs out". Nothing forgets them when they run out but
// dropped.left, which only a resync calls (after an outage or a data
// loss). On a healthy gateway every user whose connection ever dropped
// (mobile clients, every few minutes) keeps an entry for the life of the
// process: memory that grows with the distinct users seen, without bound.
func TestAttack3DroppedGrantsNeverForgotten(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.SessionTTL, c.SessionJitter = 2*time.Second, 0
		c.HeartbeatInterval = 100 * time.Millisecond
	})
	const users = 50
	for i := range users {
		ws := tg.dial(t, fmt.Sprintf("mobile-%03d", i))
		pingPong(t, ws)
		ws.UnderlyingConn().Close() // the network went: no close frame
	}
	waitUntil(t, "every connection released", func() bool { return len(tg.hub.all()) == 0 })
	// Every grant runs out 2s after its ping, and the gateway has no
	// outage: each must be forgotten soon after. Waited for, within a
	// bound far past the grants' end, so that a busy machine does not fail
	// it.
	held := func() int {
		tg.dropped.mu.Lock()
		defer tg.dropped.mu.Unlock()
		return len(tg.dropped.grants)
	}
	const bound = 15 * time.Second
	if !waitFor(bound, func() bool { return held() == 0 }) {
		t.Fatalf("DEFECT: %d of %d dropped connections' grants are still held %v after they ran out, on a gateway with no outage: "+
			"only a resync forgets them, so the map grows with every distinct user whose connection ever dropped", held(), users, bound)
	}
}
