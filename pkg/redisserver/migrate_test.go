package redisserver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

// TestMigrateSlot moves a slot that holds keys with and without a TTL to
// another master, and checks what clients meet on the way: ASK for a key
// moved already, TRYAGAIN for a command of keys split between the nodes,
// and after, every master names the new owner and the keys are there with
// their TTLs.
func TestMigrateSlot(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	ctx := context.Background()
	c := redistest.StartCluster(t)
	slot, err := c.SlotOf(ctx, "{m}")
	if err != nil {
		t.Fatal(err)
	}
	from, err := c.SlotOwner(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	to := (from + 1) % len(c.Masters)
	src := redis.NewClient(&redis.Options{Addr: c.Masters[from].Addr, MaxRetries: -1})
	defer src.Close()
	var keys []string
	for i := range 20 {
		k := fmt.Sprintf("{m}:k%d", i)
		keys = append(keys, k)
		ttl := time.Duration(0)
		if i%2 == 0 {
			ttl = time.Hour
		}
		if err := src.Set(ctx, k, i, ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}

	m, err := c.BeginMigration(ctx, slot, to)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Move(ctx, keys[0]); err != nil {
		t.Fatal(err)
	}
	if err := src.Get(ctx, keys[0]).Err(); err == nil || !strings.HasPrefix(err.Error(), "ASK ") {
		t.Errorf("GET of a moved key on the source: %v, want ASK", err)
	}
	if err := src.MGet(ctx, keys[0], keys[1]).Err(); err == nil || !strings.HasPrefix(err.Error(), "TRYAGAIN") {
		t.Errorf("MGET of keys split between the nodes: %v, want TRYAGAIN", err)
	}
	if n, err := m.MoveBatch(ctx, 5); err != nil || n != 5 {
		t.Fatalf("MoveBatch(5) = %d, %v; want 5 keys", n, err)
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}

	for i := range c.Masters {
		cl := redis.NewClient(&redis.Options{Addr: c.Masters[i].Addr})
		slots, err := redisserver.SlotMap(ctx, cl)
		cl.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slots {
			if s.Start <= slot && slot <= s.End && s.Master != c.Masters[to].Addr {
				t.Errorf("master %d says slot %d is served by %s, want %s", i, slot, s.Master, c.Masters[to].Addr)
			}
		}
	}
	if owner, err := c.SlotOwner(ctx, slot); err != nil || owner != to {
		t.Errorf("SlotOwner = %d, %v; want %d", owner, err, to)
	}
	dst := redis.NewClient(&redis.Options{Addr: c.Masters[to].Addr})
	defer dst.Close()
	for i, k := range keys {
		v, err := dst.Get(ctx, k).Int()
		if err != nil || v != i {
			t.Errorf("GET %s on the new owner = %d, %v; want %d", k, v, err, i)
		}
		ttl, err := dst.PTTL(ctx, k).Result()
		switch {
		case err != nil:
			t.Error(err)
		case i%2 == 0 && (ttl <= 0 || ttl > time.Hour):
			t.Errorf("%s: TTL %v after the move, want its hour", k, ttl)
		case i%2 == 1 && ttl != -1:
			t.Errorf("%s: TTL %v after the move, want none", k, ttl)
		}
	}
	if err := src.Exists(ctx, keys[0]).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") {
		t.Errorf("EXISTS on the old owner: %v, want MOVED", err)
	}

	t.Run("bad arguments", func(t *testing.T) {
		for _, tc := range []struct {
			slot, to int
			want     string
		}{
			{-1, 0, "slot -1"},
			{16384, 0, "slot 16384"},
			{slot, 7, "target master 7"},
			{slot, to, "serves it already"},
		} {
			if _, err := c.BeginMigration(ctx, tc.slot, tc.to); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("BeginMigration(%d, %d) = %v, want an error naming %q", tc.slot, tc.to, err, tc.want)
			}
		}
		if err := c.MigrateSlot(ctx, slot, from, 0, 0); err == nil || !strings.Contains(err.Error(), "batch 0") {
			t.Errorf("MigrateSlot with batch 0 = %v, want an error naming it", err)
		}
	})
}

// TestMigrateSlotOutranksSource moves a slot to the master with the
// greatest config epoch right after the source took a greater one (as a
// master does when it resolves an epoch collision, is promoted, or
// imports a slot), before the target heard of it. A target that keeps
// its epoch when it closes the import claims the slot below the source,
// and a claim the source sent before it was told of the move, or an
// UPDATE from a node that still names the source, gives the slot back
// to the source on the target: the target then names the source for
// good, and its moved keys are dropped. After the move the target's
// epoch must be the greatest, and the keys and ownership where they
// were sent.
func TestMigrateSlotOutranksSource(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	ctx := context.Background()
	c := redistest.StartCluster(t)
	clients := make([]*redis.Client, len(c.Masters))
	ids := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		clients[i] = redis.NewClient(&redis.Options{Addr: m.Addr})
		defer clients[i].Close()
		var err error
		if ids[i], err = clients[i].Do(ctx, "CLUSTER", "MYID").Text(); err != nil {
			t.Fatal(err)
		}
	}
	epochs, err := redisserver.WaitEpochsSettled(c, ctx)
	if err != nil {
		t.Fatal(err)
	}
	to := 0
	for i, id := range ids {
		if epochs[id] > epochs[ids[to]] {
			to = i
		}
	}
	from := (to + 1) % len(c.Masters)
	var key string
	var slot int
	for i := 0; ; i++ {
		key = fmt.Sprintf("{o%d}", i)
		if slot, err = c.SlotOf(ctx, key); err != nil {
			t.Fatal(err)
		}
		if owner, err := c.SlotOwner(ctx, slot); err != nil {
			t.Fatal(err)
		} else if owner == from {
			break
		}
	}
	for i := range 10 {
		if err := clients[from].Set(ctx, fmt.Sprintf("%s:k%d", key, i), i, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := c.BeginMigration(ctx, slot, to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.MoveBatch(ctx, 5); err != nil {
		t.Fatal(err)
	}
	bumped, err := clients[from].Do(ctx, "CLUSTER", "BUMPEPOCH").Text()
	if err != nil || !strings.HasPrefix(bumped, "BUMPED") {
		t.Fatalf("BUMPEPOCH on the source = %q, %v; want BUMPED", bumped, err)
	}
	t.Logf("target master %d at config epoch %d; the source, master %d, took %s", to, epochs[ids[to]], from, bumped)
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}

	own := make([]int64, len(c.Masters))
	for i, cl := range clients {
		text, err := cl.ClusterNodes(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		own[i] = redisserver.NodeEpochs(text)[ids[i]]
	}
	for i, e := range own {
		if i != to && e >= own[to] {
			t.Errorf("after the move the target, master %d, holds config epoch %d and master %d holds %d: "+
				"a claim of the slot from before the move can take it back from the target", to, own[to], i, e)
		}
	}
	for i := range 10 {
		k := fmt.Sprintf("%s:k%d", key, i)
		if v, err := clients[to].Get(ctx, k).Int(); err != nil || v != i {
			t.Errorf("GET %s on the new owner = %d, %v; want %d", k, v, err, i)
		}
	}
	for i := range c.Masters {
		if owner, err := c.SlotOwnerSeenBy(ctx, i, slot); err != nil || owner != to {
			t.Errorf("master %d names master %d (%v) as the owner of slot %d, want %d", i, owner, err, slot, to)
		}
	}
}
