package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/frame"
)

// Guides reach a user wherever they are connected: the push endpoint may be
// called on any gateway instance. Each instance records in Redis which
// users it holds (route keys) and listens on its own Pub/Sub channel; a
// push is delivered locally, published to the other instances the user is
// on, or, when the user is nowhere, kept in their inbox for their next
// connect.
//
// The channels are sharded (SSUBSCRIBE/SPUBLISH): in a Redis Cluster a
// shard channel lives on one master, and SPUBLISH counts its subscribers
// exactly, where a classic PUBLISH counts only those on the node it hit.

// unregisterScript drops one connection from a route, and the instance
// from it at zero. KEYS: route. ARGV: instance.
var unregisterScript = redis.NewScript(`
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if n <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return n
`)

// inboxPushScript adds a guide to a capped, TTL'd inbox.
// KEYS: inbox. ARGV: guide JSON, cap, ttl ms.
var inboxPushScript = redis.NewScript(`
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
`)

// inboxTakeScript empties an inbox and returns it, oldest first, so each
// guide in it is handed out once. KEYS: inbox.
var inboxTakeScript = redis.NewScript(`
local items = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return items
`)

// routeTTL bounds how long a crashed instance's route entries linger; a
// publish that reaches nobody also removes them.
const routeTTL = 24 * time.Hour

func newInstanceID() string {
	host, _ := os.Hostname()
	var b [4]byte
	rand.Read(b[:])
	if host == "" {
		host = "gw"
	}
	return host + "-" + hex.EncodeToString(b[:])
}

// register records that this instance holds one more connection of uid.
func (g *Gateway) register(ctx context.Context, uid string) error {
	key := g.store.Keyspace().RouteKey(uid)
	_, err := g.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HIncrBy(ctx, key, g.instance, 1)
		p.Expire(ctx, key, routeTTL)
		return nil
	})
	if err != nil {
		return fmt.Errorf("register %q's connection: %w", uid, err)
	}
	return nil
}

func (g *Gateway) unregister(ctx context.Context, uid string) error {
	err := unregisterScript.Run(ctx, g.rdb, []string{g.store.Keyspace().RouteKey(uid)}, g.instance).Err()
	if err != nil {
		return fmt.Errorf("unregister %q's connection: %w", uid, err)
	}
	return nil
}

// deliverLocal hands a guide to uid's connections on this instance.
func (g *Gateway) deliverLocal(req PushRequest) int {
	b := frame.Guide(req.ID, req.Text)
	n := 0
	for _, c := range g.hub.lookup(req.UID) {
		if c.enqueue(b) {
			n++
		}
	}
	return n
}

// deliverElsewhere publishes a guide to the other instances that hold uid,
// and returns how many took it. An instance that no longer listens is
// dropped from the route.
func (g *Gateway) deliverElsewhere(ctx context.Context, req PushRequest) (int, error) {
	ks := g.store.Keyspace()
	routes, err := g.rdb.HGetAll(ctx, ks.RouteKey(req.UID)).Result()
	if err != nil {
		return 0, fmt.Errorf("look up %q's route: %w", req.UID, err)
	}
	payload, _ := json.Marshal(req)
	n := 0
	for inst := range routes {
		if inst == g.instance {
			continue
		}
		got, err := g.rdb.SPublish(ctx, ks.InstanceChannel(inst), payload).Result()
		if err != nil {
			return n, fmt.Errorf("route guide to %s: %w", inst, err)
		}
		if got == 0 {
			g.rdb.HDel(ctx, ks.RouteKey(req.UID), inst) // a crashed instance
			continue
		}
		n++
	}
	return n, nil
}

// keep stores a guide in uid's inbox for their next connect.
func (g *Gateway) keep(ctx context.Context, req PushRequest) error {
	b, _ := json.Marshal(req)
	err := inboxPushScript.Run(ctx, g.rdb, []string{g.store.Keyspace().InboxKey(req.UID)},
		b, g.cfg.InboxSize, g.cfg.InboxTTL.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("keep guide %s for %q: %w", req.ID, req.UID, err)
	}
	return nil
}

// handOverInbox sends a newly connected user the guides kept for them.
func (g *Gateway) handOverInbox(ctx context.Context, c *conn) {
	items, err := inboxTakeScript.Run(ctx, g.rdb, []string{g.store.Keyspace().InboxKey(c.uid)}).StringSlice()
	if err != nil {
		g.routeLog.Fail(fmt.Errorf("take %q's inbox: %w", c.uid, err))
		return
	}
	for i := len(items) - 1; i >= 0; i-- { // LPUSH keeps the newest first
		var req PushRequest
		if json.Unmarshal([]byte(items[i]), &req) != nil {
			continue
		}
		c.enqueue(frame.Guide(req.ID, req.Text))
		metricPushes.WithLabelValues("from_inbox").Inc()
	}
}

// listen takes guides other instances route here until ctx is done,
// resubscribing after a broken connection. A guide for a user who has
// just left goes to their inbox.
func (g *Gateway) listen(ctx context.Context, sub *redis.PubSub) error {
	defer sub.Close()
	stop := context.AfterFunc(ctx, func() { sub.Close() })
	defer stop()
	for {
		msg, err := sub.ReceiveMessage(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			g.channelLog.Fail(err)
			time.Sleep(100 * time.Millisecond) // go-redis resubscribes on the next receive
			continue
		}
		g.channelLog.OK()
		var req PushRequest
		if err := json.Unmarshal([]byte(msg.Payload), &req); err != nil {
			g.log.Warn("bad routed guide", "err", err)
			continue
		}
		if g.deliverLocal(req) > 0 {
			metricPushes.WithLabelValues("routed_in").Inc()
			continue
		}
		if err := g.keep(ctx, req); err != nil {
			g.pushLog.Fail(err)
		}
	}
}
