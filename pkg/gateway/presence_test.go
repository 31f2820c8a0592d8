package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// onBoth runs a routing test on a single Redis and on a 3-master Redis
// Cluster.
func onBoth(t *testing.T, test func(t *testing.T, addrs []string)) {
	t.Run("single redis", func(t *testing.T) { test(t, []string{redistest.Start(t).Addr}) })
	t.Run("redis cluster", func(t *testing.T) { test(t, redistest.StartCluster(t).Addrs()) })
}

func closeNormally(ws *websocket.Conn) {
	ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
}

func sessionExists(tg *testGateway, uid string) bool {
	return tg.rdb.Exists(context.Background(), tg.store.Keyspace().SessionKey(uid)).Val() == 1
}

// TestTwoDevices: a laptop closing with 1000 does not end the session of
// the same user's phone, connected and idle; the phone is guided once.
// Only the last connection's normal close ends the session (issue case 4).
func TestTwoDevices(t *testing.T) {
	onBoth(t, func(t *testing.T, addrs []string) {
		prefix := redistest.Prefix(t)
		a := startGatewayOn(t, addrs, prefix, nil)
		b := startGatewayOn(t, addrs, prefix, nil)
		t.Run("on two instances", func(t *testing.T) { testTwoDevices(t, a, b, "dana") })
		t.Run("on one instance", func(t *testing.T) { testTwoDevices(t, a, a, "eli") })
	})
}

func testTwoDevices(t *testing.T, laptopOn, phoneOn *testGateway, uid string) {
	ctx := context.Background()
	ks := laptopOn.store.Keyspace()
	laptop := laptopOn.dial(t, uid)
	phone := phoneOn.dial(t, uid)
	pingPong(t, laptop)
	pingPong(t, phone)

	left := 0 // the laptop's instance's connections of uid once it is gone
	if laptopOn == phoneOn {
		left = 1
	}
	closeNormally(laptop)
	waitUntil(t, "the laptop is counted out", func() bool {
		n, _ := laptopOn.rdb.HGet(ctx, ks.RouteKey(uid), laptopOn.instance).Int()
		return laptopOn.hub.count(uid) == left && n == left
	})
	if !sessionExists(laptopOn, uid) {
		t.Fatal("the laptop's normal close ended the session of the connected phone")
	}
	deadline, err := laptopOn.rdb.ZScore(ctx, ks.IndexKey(session.Bucket(uid)), uid).Result()
	if err != nil {
		t.Fatalf("the session left the deadline index: %v", err)
	}

	// The phone stays idle until its session runs out; the consumer
	// pushes the guide, here through the instance the laptop was on.
	req := push.Request{ID: uid + "-1", UID: uid, Text: "Are you still there?", DeadlineMS: int64(deadline)}
	if res := laptopOn.mustPush(t, req, push.Delivered); res.Connections != 1 {
		t.Fatalf("delivered to %d connections, want the phone's 1", res.Connections)
	}
	if m := readGuide(t, phone, req.ID); m["deadline_ms"] != deadline {
		t.Fatalf("guide %v, want deadline_ms %v", m, deadline)
	}
	// A resend (a consumer that crashed before committing) is a duplicate
	// on every instance.
	phoneOn.mustPush(t, req, push.Duplicate)
	laptopOn.mustPush(t, req, push.Duplicate)
	pingPong(t, phone) // the next frame is the pong: one guide

	// The phone leaves too: its was the last connection.
	closeNormally(phone)
	waitUntil(t, "the last normal close ends the session", func() bool { return !sessionExists(phoneOn, uid) })
	if n := phoneOn.rdb.Exists(ctx, ks.RouteKey(uid)).Val(); n != 0 {
		t.Errorf("route key left after the last connection")
	}
}

// TestLiveInstanceStaysInRoute: a publish that reached no subscriber drops
// an instance from a route only when its heartbeat says it is dead, and an
// instance that resubscribes registers its users again (issue case 5).
func TestLiveInstanceStaysInRoute(t *testing.T) {
	onBoth(t, testLiveInstanceStaysInRoute)
}

func testLiveInstanceStaysInRoute(t *testing.T, addrs []string) {
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	a := startGatewayOn(t, addrs, prefix, nil)
	b := startGatewayOn(t, addrs, prefix, nil)
	ks := a.store.Keyspace()

	t.Run("alive but not listening", func(t *testing.T) {
		// An instance alive by its heartbeat, between two subscriptions.
		if _, err := a.store.Heartbeat(ctx, "resubscribing", time.Minute); err != nil {
			t.Fatal(err)
		}
		a.rdb.HSet(ctx, ks.RouteKey("eve"), "resubscribing", 1)
		req := push.Request{ID: "e1", UID: "eve", Text: "t"}
		_, err := a.pushGuide(t, req)
		var e *push.Error
		if !errors.As(err, &e) || e.Status != push.Retry || e.Code != 503 {
			t.Fatalf("push to a user on a live instance not listening: %v; want retry (503)", err)
		}
		if n, _ := a.rdb.HGet(ctx, ks.RouteKey("eve"), "resubscribing").Int(); n != 1 {
			t.Fatal("a live instance was dropped from the route after one publish reached nobody")
		}
		if n := a.rdb.LLen(ctx, ks.InboxKey("eve")).Val(); n != 0 {
			t.Fatalf("the guide went to the inbox of a connected user (%d)", n)
		}
		// Dead by its heartbeat: dropped, and the guide kept.
		if err := a.store.Leave(ctx, "resubscribing"); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the instance is seen dead", func() bool { return a.instanceDead("resubscribing") })
		a.mustPush(t, req, push.Queued)
		if a.rdb.HExists(ctx, ks.RouteKey("eve"), "resubscribing").Val() {
			t.Fatal("a dead instance stayed in the route")
		}
	})

	t.Run("resubscribing registers users again", func(t *testing.T) {
		ws := a.dial(t, "finn")
		pingPong(t, ws)
		// As a publish to nobody used to: a's entry is gone.
		a.rdb.HDel(ctx, ks.RouteKey("finn"), a.instance)
		killSubscribers(t, a.rdb)
		waitUntil(t, "a registers finn again", func() bool {
			n, _ := a.rdb.HGet(ctx, ks.RouteKey("finn"), a.instance).Int()
			return n == 1
		})
		b.mustPush(t, push.Request{ID: "f1", UID: "finn", Text: "t"}, push.Delivered)
		readGuide(t, ws, "f1")
	})

	t.Run("a push during a resubscribe", func(t *testing.T) {
		ws := a.dial(t, "gil")
		pingPong(t, ws)
		killSubscribers(t, a.rdb)
		req := push.Request{ID: "g1", UID: "gil", Text: "t"}
		var res push.Response
		var err error
		if !waitFor(10*time.Second, func() bool {
			if res, err = b.pushGuide(t, req); err == nil {
				return true
			}
			var e *push.Error
			if !errors.As(err, &e) || e.Status != push.Retry {
				t.Fatalf("push during a resubscribe: %v", err)
			}
			return false
		}) {
			t.Fatalf("push during a resubscribe: %v", err)
		}
		if res.Status != push.Delivered {
			t.Fatalf("push during a resubscribe: %s, want delivered (or a retry)", res.Status)
		}
		readGuide(t, ws, "g1")
		if n, _ := a.rdb.HGet(ctx, ks.RouteKey("gil"), a.instance).Int(); n != 1 {
			t.Fatal("the live instance left gil's route")
		}
	})
}

// killSubscribers cuts every Pub/Sub connection, on every master: their
// clients resubscribe.
func killSubscribers(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	kill := func(ctx context.Context, c *redis.Client) error {
		return c.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err()
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, kill)
	case *redis.Client:
		err = kill(ctx, c)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestRouteKeysRefreshed: route keys are refreshed while their
// connections live, and counts a failed write left wrong heal (issue case
// 6).
func TestRouteKeysRefreshed(t *testing.T) {
	onBoth(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		prefix := redistest.Prefix(t)
		short := func(c *Config) {
			c.routeRefreshEvery = 200 * time.Millisecond
			c.routeKeyTTL = 2 * time.Second
		}
		a := startGatewayOn(t, addrs, prefix, short)
		b := startGatewayOn(t, addrs, prefix, short)
		key := a.store.Keyspace().RouteKey("gus")
		ws := a.dial(t, "gus")
		pingPong(t, ws)

		// The key is about to run out, as one written a TTL ago is: a
		// refresh (every 200ms here) gives it the route TTL again.
		a.rdb.PExpire(ctx, key, 300*time.Millisecond)
		var pttl time.Duration
		if !waitFor(5*time.Second, func() bool {
			pttl = a.rdb.PTTL(ctx, key).Val()
			return pttl > 300*time.Millisecond && pttl <= 2*time.Second
		}) {
			t.Fatalf("route key PTTL %v: not refreshed", pttl)
		}
		b.mustPush(t, push.Request{ID: "gus-1", UID: "gus", Text: "t"}, push.Delivered)
		readGuide(t, ws, "gus-1")

		for name, wrong := range map[string]func(){
			"an unregister that failed": func() { a.rdb.HSet(ctx, key, a.instance, 5) },
			"a register that failed":    func() { a.rdb.HDel(ctx, key, a.instance) },
		} {
			wrong()
			waitUntil(t, "the count heals after "+name, func() bool {
				n, _ := a.rdb.HGet(ctx, key, a.instance).Int()
				return n == 1
			})
		}
	})
}
