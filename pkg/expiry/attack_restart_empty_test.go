package expiry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/gateway"
)

// TestAttackQuickEmptyRestartLosesSilentUsers: Redis restarts without its
// data (no persistence, or a node replaced by an empty one), quickly, as
// a pod restart does. The gateway's client retries the few commands that
// met the restart, so no renewal or heartbeat fails, and the gateway never
// learns that its sessions are gone: it does not resync. The users who go
// silent now (connected, no ping since before the restart) never lapse
// again, so they never get their guide. The issue: "Sessions lost with
// the data come back through the gateways' resync", and every user who
// went silent during the fault gets exactly one guide.
func TestAttackQuickEmptyRestartLosesSilentUsers(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const ttl = 3 * time.Second
	gw := h.startAttackGateway(h.srv.Addr, ttl, func(c *gateway.Config) { c.HeartbeatInterval = time.Second })
	stop := h.start(h.config(ModeSweep))
	defer stop()

	active := startPinger(t, gw, "active", ttl/4)
	var silent []string
	for i := range 5 {
		uid := fmt.Sprintf("silent-%d", i)
		startPinger(t, gw, uid, 0) // one ping, then connected and quiet
		silent = append(silent, uid)
	}
	eventually(waitLong, func() bool {
		for _, uid := range silent {
			if !h.inIndex(uid) {
				return false
			}
		}
		return true
	})
	ctx := context.Background()
	for _, uid := range silent {
		if !h.inIndex(uid) {
			t.Fatalf("%s has no session before the restart", uid)
		}
	}
	began := time.Now()
	if err := h.srv.RestartEmpty(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("redis restarted empty in %v", time.Since(began))
	// Everyone's last grant runs out, the grace passes, and a sweep
	// after it.
	h.sweptPast(h.redisNow().Add(ttl + testGrace))
	active.stop()
	stop()

	got := byUID(h.events())
	for _, uid := range silent {
		if n := len(got[uid]); n != 1 {
			t.Errorf("%s went silent before the restart: %d guides, want 1 (session in index now: %v)", uid, n, h.inIndex(uid))
		}
	}
	if n := len(got["active"]); n != 0 {
		t.Errorf("active kept pinging: %d guides", n)
	}
}
