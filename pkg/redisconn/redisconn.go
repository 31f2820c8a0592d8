// Package redisconn opens the Redis client the services share: a single
// node, or a Redis Cluster when several seed addresses are given, over TLS
// when configured.
package redisconn

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tlsfiles"
)

// Config says where Redis is and how the deployment's keys are named.
type Config struct {
	// Addrs are host:port seeds. One address is a single Redis unless
	// Cluster is set; several are always a cluster's seeds.
	Addrs []string
	// Cluster forces cluster mode for a single seed address.
	Cluster bool
	// Username and Password for Redis ACL auth; empty means none.
	Username, Password string
	// KeyPrefix starts every key, so deployments sharing a Redis stay
	// apart. Default "st".
	KeyPrefix string
	// TLS connects over TLS. Default false.
	TLS bool
	// TLSFiles are the CA, client certificate and server name of TLS. All
	// optional. A cluster's nodes are dialed at the addresses they
	// announce, often IPs: name the certificate's host in ServerName then.
	TLSFiles tlsfiles.Files
	// PoolSize is the most connections per node; 0 is go-redis's
	// default, 10 per CPU. Not a setting: a service sizes a client of
	// its own for work that must not queue behind the rest.
	PoolSize int
}

// DefaultConfig is the Redis settings by default: one local server, keys
// under "st".
func DefaultConfig() Config {
	return Config{Addrs: []string{"127.0.0.1:6379"}, KeyPrefix: "st"}
}

// Bind registers the Redis settings.
func (c *Config) Bind(b *config.Binder) {
	d := DefaultConfig()
	b.List(&c.Addrs, "redis-addrs", strings.Join(d.Addrs, ","), "Redis address, or comma-separated cluster seeds")
	b.String(&c.Username, "redis-username", "", "Redis ACL user name")
	b.Secret(&c.Password, "redis-password", "Redis password")
	b.String(&c.KeyPrefix, "key-prefix", d.KeyPrefix, "prefix of every Redis key")
	b.Bool(&c.Cluster, "redis-cluster", false, "use Redis Cluster even with one seed address")
	b.Bool(&c.TLS, "redis-tls", false, "connect to Redis over TLS")
	b.String(&c.TLSFiles.CAFile, "redis-tls-ca-file", "", "PEM CA bundle that verifies Redis; empty uses the system roots")
	b.String(&c.TLSFiles.CertFile, "redis-tls-cert-file", "", "PEM client certificate, for mutual TLS")
	b.String(&c.TLSFiles.KeyFile, "redis-tls-key-file", "", "PEM key of the client certificate")
	b.String(&c.TLSFiles.ServerName, "redis-tls-server-name", "", "name verified in Redis's certificate; empty uses the host dialed")
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if len(c.Addrs) == 0 {
		return fmt.Errorf("redis-addrs: no address given")
	}
	for _, a := range c.Addrs {
		if !strings.Contains(a, ":") {
			return fmt.Errorf("redis-addrs: %q is not host:port", a)
		}
	}
	if _, err := session.NewKeyspace(c.KeyPrefix); err != nil {
		return fmt.Errorf("key-prefix: %w", err)
	}
	return c.TLSFiles.Check("redis-tls", c.TLS)
}

// Keyspace is the key layout for the configured prefix.
func (c Config) Keyspace() session.Keyspace {
	ks, err := session.NewKeyspace(c.KeyPrefix)
	if err != nil {
		panic("redisconn: Keyspace before Validate: " + err.Error())
	}
	return ks
}

// Open connects and checks the connection with a PING.
func Open(ctx context.Context, c Config) (redis.UniversalClient, error) {
	var tc *tls.Config
	if c.TLS {
		var err error
		if tc, err = c.TLSFiles.Config("redis-tls"); err != nil {
			return nil, err
		}
	}
	var rdb redis.UniversalClient
	if c.Cluster || len(c.Addrs) > 1 {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{
			// A copy: go-redis appends the nodes it learns to this slice,
			// which would write into the caller's array, shared by every
			// client opened from the same Config (a data race between
			// the gateway's two clients, seen in a failover test).
			Addrs:     slices.Clip(slices.Clone(c.Addrs)),
			Username:  c.Username,
			Password:  c.Password,
			TLSConfig: tc,
			// A master that dies answers nothing, so no MOVED tells the
			// client of its replica's promotion: re-read the slot map
			// every 2s (go-redis's default is 60s) to follow a failover.
			ClusterStateReloadInterval: clusterStateReload,
			PoolSize:                   c.PoolSize,
		})
	} else {
		rdb = redis.NewClient(&redis.Options{
			Addr:      c.Addrs[0],
			Username:  c.Username,
			Password:  c.Password,
			TLSConfig: tc,
			PoolSize:  c.PoolSize,
		})
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("connect to redis %s: %w", strings.Join(c.Addrs, ","), err)
	}
	return rdb, nil
}

// clusterStateReload bounds how long a cluster client keeps a dead
// master's slots after a failover.
const clusterStateReload = 2 * time.Second
