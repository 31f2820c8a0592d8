package redisconn

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

func TestCheckEviction(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string // empty: nil
	}{
		{"no maxmemory", nil, ""},
		{"maxmemory with noeviction", []string{"--maxmemory", "100mb", "--maxmemory-policy", "noeviction"}, ""},
		{"maxmemory with allkeys-lru", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, "maxmemory-policy allkeys-lru"},
		{"volatile eviction evicts sessions too", []string{"--maxmemory", "100mb", "--maxmemory-policy", "volatile-ttl"}, "maxmemory-policy volatile-ttl"},
		{"an eviction policy without maxmemory", []string{"--maxmemory-policy", "allkeys-lru"}, ""},
		// As managed Redis services do: the check cannot tell, and says nothing.
		{"CONFIG renamed away", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", ""}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := redisserver.Start(ctx, redisserver.Options{Dir: t.TempDir(), Args: tc.args})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			err = CheckEviction(ctx, redistest.Client(t, srv))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("CheckEviction = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), srv.Addr)):
				t.Fatalf("CheckEviction = %v, want an error naming %s and %q", err, srv.Addr, tc.wantErr)
			}
		})
	}

	t.Run("cluster names the master that evicts", func(t *testing.T) {
		c := redistest.StartCluster(t)
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
		t.Cleanup(func() { rdb.Close() })
		if err := CheckEviction(ctx, rdb); err != nil {
			t.Fatalf("no master evicts: CheckEviction = %v", err)
		}
		evicting := c.Addrs()[1]
		node := redis.NewClient(&redis.Options{Addr: evicting})
		t.Cleanup(func() { node.Close() })
		for k, v := range map[string]string{"maxmemory": "100mb", "maxmemory-policy": "allkeys-lru"} {
			if err := node.ConfigSet(ctx, k, v).Err(); err != nil {
				t.Fatal(err)
			}
		}
		err := CheckEviction(ctx, rdb)
		if err == nil || !strings.Contains(err.Error(), evicting) || !strings.Contains(err.Error(), "allkeys-lru") {
			t.Fatalf("CheckEviction = %v, want an error naming %s", err, evicting)
		}
		for _, other := range []string{c.Addrs()[0], c.Addrs()[2]} {
			if strings.Contains(err.Error(), other+":") {
				t.Errorf("error names %s, which does not evict: %v", other, err)
			}
		}
	})
}
