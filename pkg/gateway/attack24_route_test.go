package gateway

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttack24RouteKeyLapsesBehindSlowFlushes: the route refresh now
// marks one hub shard per tick of routeRefresh/hubShards, and the shard
// index moves only on a tick the writer takes. A tick that comes while
// the writer is in a flush waits, and the ticks after it are dropped
// (time.Ticker keeps one). So a user's key is written again only after 64
// ticks taken: when flushes take long (a busy Redis, a reregister's
// thousands of users at 512 a round trip, a connect storm that keeps
// pending marks), the period of a shard stretches to 64 times the flush,
// past the route TTL, where markAll's stretched only to one flush. The key
// of a connected user lapses: a guide for them goes to the inbox instead
// of their open connection, and the listener no longer sees the instance
// that holds them among their routes.
//
// Here Redis stops for 400ms out of every 440ms (as the busy Redis of the
// gateway's busy test does, but shorter than the heartbeat's lease, so no
// reregister heals it), with a refresh of 640ms (a tick every 10ms) and a
// route TTL of 3s, five refreshes.
func TestAttack24RouteKeyLapsesBehindSlowFlushes(t *testing.T) {
	if testing.Short() {
		t.Skip("some 8s of a stalling Redis")
	}
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	tg := startGatewayOn(t, []string{srv.Addr}, prefix, func(c *Config) {
		c.routeRefreshEvery = 640 * time.Millisecond
		c.routeKeyTTL = 3 * time.Second
		c.HeartbeatInterval = time.Second // a lease of 3s: stalls of 400ms are no gap
	})
	direct := redistest.Client(t, srv)
	ks, err := session.NewKeyspace(prefix)
	if err != nil {
		t.Fatal(err)
	}
	const users = 200 // every hub shard holds some, as on a gateway in production
	conns := make([]*websocket.Conn, users)
	for i := range conns {
		conns[i] = tg.dial(t, fmt.Sprintf("route-%d", i))
		pingPong(t, conns[i])
	}
	waitUntil(t, "every route key written", func() bool {
		for i := range users {
			if n, _ := direct.Exists(t.Context(), ks.RouteKey(fmt.Sprintf("route-%d", i))).Result(); n == 0 {
				return false
			}
		}
		return true
	})

	// Real time must pass: the stalls are a busy Redis's, and the route
	// TTL is real time in Redis.
	var lapsed []string
	start := time.Now()
	for time.Since(start) < 8*time.Second && len(lapsed) == 0 {
		srv.Pause()
		time.Sleep(400 * time.Millisecond)
		srv.Resume()
		time.Sleep(40 * time.Millisecond)
		for i := range users {
			uid := fmt.Sprintf("route-%d", i)
			if n, err := direct.Exists(t.Context(), ks.RouteKey(uid)).Result(); err == nil && n == 0 && tg.hub.count(uid) > 0 {
				lapsed = append(lapsed, uid)
			}
		}
	}
	if len(lapsed) > 0 {
		t.Errorf("route keys of %v lapsed while their connections were open, %v into a Redis answering every round trip late",
			lapsed, time.Since(start).Round(time.Millisecond))
	}
}
