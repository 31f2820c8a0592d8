package redisserver

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Slots is one range of a cluster's slot map and the master serving it.
type Slots struct {
	Start, End int
	// Master is the serving master's address, "" when the range has none.
	Master string
}

// SlotMap is the slot map as the node cl talks to sees it (CLUSTER SHARDS,
// Redis 7.0 and later).
func SlotMap(ctx context.Context, cl redis.Cmdable) ([]Slots, error) {
	shards, err := cl.ClusterShards(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster shards: %w", err)
	}
	var out []Slots
	for _, sh := range shards {
		master := ""
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				host := n.IP
				if host == "" {
					host = n.Endpoint
				}
				master = net.JoinHostPort(host, strconv.FormatInt(n.Port, 10))
			}
		}
		for _, r := range sh.Slots {
			out = append(out, Slots{Start: int(r.Start), End: int(r.End), Master: master})
		}
	}
	return out, nil
}
