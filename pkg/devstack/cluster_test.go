package devstack

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestEndToEndOnCluster runs the whole flow against a 3-master Redis
// Cluster: session keys, deadline indexes, dedup and push keys spread over
// the masters by their bucket hash tags, the listener subscribes to each
// master's expired events, and guides route over cluster Pub/Sub.
func TestEndToEndOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cluster := redistest.StartCluster(t)
	s := startStack(t, map[string]string{"STILLTHERE_REDIS_ADDRS": strings.Join(cluster.Addrs(), ",")})

	t.Run("buckets spread over every master", func(t *testing.T) {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		defer rdb.Close()
		ks := s.GatewayConfig.Redis.Keyspace()
		owners := map[string]int{}
		for b := range session.Buckets {
			slot, err := rdb.ClusterKeySlot(context.Background(), ks.IndexKey(b)).Result()
			if err != nil {
				t.Fatal(err)
			}
			slots, err := redisserver.SlotMap(context.Background(), rdb)
			if err != nil {
				t.Fatal(err)
			}
			for _, sl := range slots {
				if int64(sl.Start) <= slot && slot <= int64(sl.End) {
					owners[sl.Master]++
				}
			}
		}
		if len(owners) != 3 {
			t.Fatalf("the %d buckets live on %d masters, want 3: %v", session.Buckets, len(owners), owners)
		}
		for addr, n := range owners {
			if n < session.Buckets/6 {
				t.Errorf("master %s holds only %d of %d buckets", addr, n, session.Buckets)
			}
		}
		t.Logf("buckets per master: %v", owners)
	})
	t.Run("flow", func(t *testing.T) { testFlow(t, s) })
}
