package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttack27DroppedRouteHoldsInEveryMode: "a user is present while any
// of their devices pings". A user's phone is on gateway A, their laptop
// on gateway B, whose grant (an idle laptop's one ping) is the session's
// deadline. A's path to Redis is cut: its heartbeat lapses, and B's route
// write passes it as dead and drops its entry (remembered in the route's
// stamps, for the hold rules). The deadline then passes while A may still
// have the phone's pings it cannot write: the gateway-dead rule must hold
// it. The sweep sees the dropped entry; an expired keyspace event's
// lookup does not, and in events mode (as in hybrid mode, when the event
// beats the read-ahead's timer) the user is guided at once.
func TestAttack27DroppedRouteHoldsInEveryMode(t *testing.T) {
	for _, mode := range []string{ModeSweep, ModeEvents} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ctx := context.Background()
			const lease = 300 * time.Millisecond
			stopA := h.heartbeat("gw-a", lease)
			h.heartbeat("gw-b", lease)
			stop := h.start(h.config(mode))
			defer stop()
			if mode == ModeEvents {
				h.waitSubscribed(1)
			}
			const uid = "phone-and-laptop"
			write := func(inst string, dead ...session.DeadInstance) {
				t.Helper()
				if res := h.store.WriteRoutes(ctx, inst, []session.RouteCount{{UID: uid, Count: 1}}, time.Hour, dead)[0]; res.Err != nil {
					t.Fatal(res.Err)
				}
			}
			write("gw-a") // the phone
			write("gw-b") // the laptop
			// A is cut from Redis: no more heartbeats, no more writes.
			stopA()
			cut := h.redisNow()
			h.untilRedis(cut.Add(lease)) // A's lease has run out: B judges it dead
			write("gw-b", session.DeadInstance{Name: "gw-a", Cut: cut})
			// The laptop's grant, the last renewal Redis knows of; it runs
			// out well within the grace after A's last heartbeat.
			g := h.renewVia("gw-b", uid, time.Second)

			waitFor(t, waitLong, uid+"'s timeout to be held or produced", func() bool {
				return h.heldUIDs()[uid] || h.produced() > 0
			})
			if n := h.produced(); n > 0 {
				evs := byUID(h.events())[uid]
				t.Errorf("%s mode: %d timeout event(s) for %s (deadline %v), %v after gateway A, whose route entry was dropped as dead while its phone may ping it, stopped; want it held for the grace",
					mode, n, uid, g.deadline.Format("15:04:05.000"), time.UnixMilli(evs[0].DetectedMS).Sub(cut))
			}
		})
	}
}
