package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

// Attacks on the route written again at a renewal that finds Redis
// knowing nothing of its user, and on the close handed to a device open
// before it.

// TestAttackRouteLostOnTwoInstancesOnlyFirstRewrites: the user is
// connected on two instances, A (laptop) and B (phone), and Redis loses
// their keys (a node restarted without its data). Only the first renewal
// after the loss finds Redis knowing nothing of the user: it writes the
// renewed key, so the other instance's renewals find it known and never
// write their route entry again. The route then names A only; the
// laptop's normal close finds no connection of the user left anywhere
// and ends the session of the phone, still connected on B: its silence
// is never guided.
func TestAttackRouteLostOnTwoInstancesOnlyFirstRewrites(t *testing.T) {
	addrs, prefix := []string{redistest.Start(t).Addr}, redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ctx := context.Background()
	ks := a.store.Keyspace()
	uid := "ar-two"
	laptop := a.dial(t, uid)
	phone := b.dial(t, uid)
	pingPong(t, laptop)
	pingPong(t, phone)
	waitUntil(t, "both instances in the route", func() bool {
		return len(a.rdb.HGetAll(ctx, ks.RouteKey(uid)).Val()) == 2
	})
	// The user's keys go, as on a node restarted empty.
	if err := a.rdb.Del(ctx, ks.RouteKey(uid), ks.RenewedKey(uid), ks.SessionKey(uid)).Err(); err != nil {
		t.Fatal(err)
	}
	pingPong(t, laptop)
	waitUntil(t, "A's route entry written again", func() bool {
		return a.rdb.HExists(ctx, ks.RouteKey(uid), a.instance).Val()
	})
	pingPong(t, phone)
	// B's renewal, like A's, follows a loss of its route entry; give a
	// rewrite it may start time to land before the laptop leaves.
	bBack := waitFor(5*time.Second, func() bool { return a.rdb.HExists(ctx, ks.RouteKey(uid), b.instance).Val() })

	closeNormally(laptop)
	waitUntil(t, "the laptop is counted out", func() bool {
		return a.hub.count(uid) == 0 && !a.rdb.HExists(ctx, ks.RouteKey(uid), a.instance).Val()
	})
	if !sessionExists(a, uid) {
		t.Errorf("the laptop's normal close ended the session of the phone connected on B (B's route entry written again after the loss: %v): "+
			"only the first renewal after the loss found Redis knowing nothing of the user, and B's ping never wrote B's entry again", bBack)
	}
}
