// Package redistest gives each test its own real redis-server and a key
// prefix nobody else uses.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver"
)

// Start runs a redis-server for the test and stops it at cleanup. The test
// fails (not skips) when redis-server is missing: CI installs it.
func Start(t testing.TB) *redisserver.Server {
	t.Helper()
	srv, err := redisserver.Start(context.Background(), redisserver.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// Client connects to srv and closes at cleanup.
func Client(t testing.TB, srv *redisserver.Server) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// Prefix returns a random key prefix, so tests sharing a server never meet.
func Prefix(t testing.TB) string {
	var b [4]byte
	rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:])
}

// StartCluster runs a 3-master Redis Cluster for the test and stops it at
// cleanup.
func StartCluster(t testing.TB) *redisserver.Cluster {
	t.Helper()
	c, err := redisserver.StartCluster(context.Background(), t.TempDir(), 3)
	if err != nil {
		t.Fatalf("start redis cluster: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
