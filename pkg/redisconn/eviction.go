package redisconn

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// CheckEviction returns an error naming every master that may evict keys:
// one with a maxmemory and a maxmemory-policy other than noeviction. An
// evicted session key or deadline-index entry is a user timed out while
// present, or never timed out; stillthere needs noeviction. A Redis that
// refuses CONFIG GET, as managed ones often do, cannot be checked: that
// is not an error.
func CheckEviction(ctx context.Context, rdb redis.UniversalClient) error {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return checkEviction(ctx, rdb, addrOf(rdb))
	}
	var mu sync.Mutex
	var errs []error
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		if err := checkEviction(ctx, c, c.Options().Addr); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("check eviction policy: %w", err)
	}
	return errors.Join(errs...)
}

func checkEviction(ctx context.Context, c redis.Cmdable, addr string) error {
	mem, err := c.ConfigGet(ctx, "maxmemory").Result()
	if err == nil {
		var pol map[string]string
		pol, err = c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err == nil {
			return evictionErr(addr, mem["maxmemory"], pol["maxmemory-policy"])
		}
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return nil // CONFIG refused: renamed away, or not allowed to this user
	}
	return fmt.Errorf("check eviction policy of redis %s: %w", addr, err)
}

func evictionErr(addr, maxmemory, policy string) error {
	n, err := strconv.ParseInt(maxmemory, 10, 64)
	if err != nil || n <= 0 || policy == "noeviction" || policy == "" {
		return nil
	}
	return fmt.Errorf("redis %s: maxmemory %d bytes with maxmemory-policy %s: at the limit it evicts keys, sessions among them; set maxmemory-policy noeviction", addr, n, policy)
}

// addrOf names the server of a client that is not a cluster's.
func addrOf(rdb redis.UniversalClient) string {
	if c, ok := rdb.(*redis.Client); ok {
		return c.Options().Addr
	}
	return "(unknown address)"
}
