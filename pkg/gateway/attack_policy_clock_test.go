package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttackPolicyClockSwitchToPresence: the operator moves a segment
// from the turn clock back to the presence clock, live ("gateway policy
// set -clock support=presence"), for instance because the platform
// stopped reporting turns for it. A user who connected while the segment
// was on the turn clock, and got no turn to them, is parked (their
// deadline a day out). After the change each of their pings is a
// presence-clock renewal: their silence must count from their last ping,
// a TTL. The gateway passes the presence clock with the ping, but the
// renewal keeps the park of the old clock, so the user who then goes
// silent is asked whether they are still there a day late, and a close
// stage holds their chat open for that day.
func TestAttackPolicyClockSwitchToPresence(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	store := policy.NewStore(tg.rdb, tg.store.Keyspace())
	const ttl = 10 * time.Second
	turn := policy.Policy{DefaultTTL: ttl, Segments: map[string]time.Duration{"support": ttl},
		Clocks: map[string]session.Clock{"support": session.ClockTurn}}
	if err := store.Save(ctx, turn); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the gateway to apply the turn clock", func() bool {
		return tg.policy.Current().Clock("support") == session.ClockTurn
	})
	ws := tg.dialSegment(t, "sam", "support")
	pingPong(t, ws)
	left := func() time.Duration {
		d, err := tg.rdb.PTTL(ctx, tg.store.Keyspace().SessionKey("sam")).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := left(); d < time.Hour {
		t.Fatalf("on the turn clock before a first turn: session left %v, want parked for about a day", d)
	}

	presence := turn
	presence.Clocks = map[string]session.Clock{"support": session.ClockPresence}
	if err := store.Save(ctx, presence); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the gateway to apply the presence clock", func() bool {
		return tg.policy.Current().Clock("support") == session.ClockPresence
	})
	pingPong(t, ws) // every ping renews (granularity 0)
	if d := left(); d > ttl+2*time.Second {
		t.Fatalf("a ping on the presence clock after the switch: session left %v, want at most the TTL %v plus jitter: "+
			"the user, silent from now on, is guided about %v late", d, ttl, (d - ttl).Round(time.Minute))
	}
}
