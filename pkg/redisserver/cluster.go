package redisserver

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of masters on loopback ports, each a child
// redis-server, with the 16384 slots split evenly between them.
type Cluster struct {
	Masters []*Server
}

// Addrs are the masters' addresses, usable as cluster seeds.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		out[i] = m.Addr
	}
	return out
}

// Close stops every node.
func (c *Cluster) Close() error {
	for _, m := range c.Masters {
		m.Close()
	}
	return nil
}

// StartCluster starts n masters under dir (a temporary directory when
// empty), assigns the slots, joins them, and returns once every node
// reports the cluster ok.
func StartCluster(ctx context.Context, dir string, n int) (*Cluster, error) {
	if n < 1 {
		return nil, errors.New("a cluster needs at least one master")
	}
	c := &Cluster{}
	for i := range n {
		nodeDir := ""
		if dir != "" {
			nodeDir = filepath.Join(dir, "node"+strconv.Itoa(i))
		}
		srv, err := Start(ctx, Options{
			Dir: nodeDir,
			Args: []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "2000",
				"--cluster-require-full-coverage", "yes",
			},
		})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("cluster node %d: %w", i, err)
		}
		c.Masters = append(c.Masters, srv)
	}
	if err := c.form(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) form(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.Masters))
	for i, m := range c.Masters {
		clients[i] = redis.NewClient(&redis.Options{Addr: m.Addr})
		defer clients[i].Close()
	}
	const slots = 16384
	per := slots / len(c.Masters)
	for i, cl := range clients {
		lo, hi := i*per, (i+1)*per-1
		if i == len(clients)-1 {
			hi = slots - 1
		}
		if err := cl.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("assign slots %d-%d to %s: %w", lo, hi, c.Masters[i].Addr, err)
		}
	}
	first := c.Masters[0].Addr
	host, port, _ := strings.Cut(first, ":")
	for i, cl := range clients[1:] {
		if err := cl.ClusterMeet(ctx, host, port).Err(); err != nil {
			return fmt.Errorf("join %s to %s: %w", c.Masters[i+1].Addr, first, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, cl := range clients {
		for {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(clients))) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cluster not ok within 30s: %v %q", err, info)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}
