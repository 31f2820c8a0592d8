package redisserver

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config epochs decide who owns a slot when two masters claim it: every
// node takes the claim of the greater epoch, by its own knowledge of the
// epochs, and tells a node with a lesser claim so (an UPDATE message).
// Assigning slots by hand (CLUSTER SETSLOT NODE) gives no epoch to the
// new owner except one case: the target of a migration, told it owns
// the slot it imports, takes a new epoch, but only when its own is not
// already the greatest it knows of. Its knowledge is what gossip brought
// it. While masters still resolve colliding epochs (a freshly formed
// cluster: every master starts at epoch 0), or right after a master took
// a new epoch (a failover, an earlier import) that the target has not
// heard of, the target keeps an epoch no greater than the source's.
// Then a ping the source sent before it was told of the move, or an
// UPDATE from a node that still names the source, hands the slot back to
// the source on the target (dropping the keys moved there), and as the
// source no longer claims it, the target names the source for good.

// nodeEpochs are the config epochs of the nodes one node lists in
// CLUSTER NODES, by node id.
func nodeEpochs(clusterNodes string) map[string]int64 {
	out := map[string]int64{}
	for line := range strings.Lines(clusterNodes) {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		if e, err := strconv.ParseInt(f[6], 10, 64); err == nil {
			out[f[0]] = e
		}
	}
	return out
}

// settledEpochs says whether the masters' config epochs are settled:
// every view (one node's nodeEpochs) gives each master the epoch that
// master gives itself, and no two masters share an epoch. It returns the
// masters' epochs, or what is not settled yet.
func settledEpochs(masters []string, views []map[string]int64) (map[string]int64, error) {
	own := map[string]int64{}
	owner := map[int64]int{}
	for i, id := range masters {
		e, ok := views[i][id]
		if !ok {
			return nil, fmt.Errorf("master %d does not list itself", i)
		}
		if j, dup := owner[e]; dup {
			return nil, fmt.Errorf("masters %d and %d share config epoch %d", j, i, e)
		}
		own[id], owner[e] = e, i
	}
	for v, view := range views {
		for i, id := range masters {
			if e, ok := view[id]; !ok || e != own[id] {
				return nil, fmt.Errorf("node %d sees master %d at config epoch %d (known: %t), its own is %d", v, i, e, ok, own[id])
			}
		}
	}
	return own, nil
}

// outranks says whether master target's config epoch is greater than
// every other master's.
func outranks(target string, epochs map[string]int64) error {
	var others []string
	for id, e := range epochs {
		if id != target && e >= epochs[target] {
			others = append(others, fmt.Sprintf("%.8s at %d", id, e))
		}
	}
	if len(others) > 0 {
		sort.Strings(others)
		return fmt.Errorf("master %.8s holds config epoch %d, not greater than %s", target, epochs[target], strings.Join(others, ", "))
	}
	return nil
}

// waitEpochsSettled returns the masters' config epochs, by node id, once
// every live node (masters and replicas) agrees on them and they are
// distinct: from then on a master's view of the greatest epoch is true,
// and an epoch it takes is greater than every other master's.
func (c *Cluster) waitEpochsSettled(ctx context.Context) (map[string]int64, error) {
	var ids []string
	var nodes []*Server
	for _, m := range c.Masters {
		id, err := nodeID(ctx, m.Addr)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
		nodes = append(nodes, m)
	}
	for _, r := range c.Replicas {
		if r != nil {
			nodes = append(nodes, r)
		}
	}
	clients := make([]*redis.Client, len(nodes))
	for i, n := range nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr})
		defer clients[i].Close()
	}
	var epochs map[string]int64
	err := poll(ctx, 30*time.Second, func() error {
		views := make([]map[string]int64, len(clients))
		for i, cl := range clients {
			text, err := cl.ClusterNodes(ctx).Result()
			if err != nil {
				return fmt.Errorf("cluster nodes of %s: %w", nodes[i].Addr, err)
			}
			views[i] = nodeEpochs(text)
		}
		var err error
		epochs, err = settledEpochs(ids, views)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("config epochs not settled within 30s: %w", err)
	}
	return epochs, nil
}
