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
	// Replicas[i], when AddReplicas was called, replicates Masters[i].
	Replicas []*Server

	dir string
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
	for _, m := range append(c.Masters, c.Replicas...) {
		if m != nil {
			m.Close()
		}
	}
	return nil
}

func nodeArgs() []string {
	return []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000",
		"--cluster-require-full-coverage", "yes",
	}
}

// StartCluster starts n masters under dir (a temporary directory when
// empty), assigns the slots, joins them, and returns once every node
// reports the cluster ok.
func StartCluster(ctx context.Context, dir string, n int) (*Cluster, error) {
	if n < 1 {
		return nil, errors.New("a cluster needs at least one master")
	}
	c := &Cluster{dir: dir}
	for i := range n {
		nodeDir := ""
		if dir != "" {
			nodeDir = filepath.Join(dir, "node"+strconv.Itoa(i))
		}
		srv, err := Start(ctx, Options{Dir: nodeDir, Args: nodeArgs()})
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
	// Masters start at config epoch 0 and settle their clashes over
	// gossip: until then a slot's handover may not hold (see Finish), and
	// a test that moves a slot must not spend its retry window on it.
	if _, err := c.waitEpochsSettled(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster config epochs: %w", err)
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

// AddReplicas gives every master one replica and returns once each has
// synced with its master.
func (c *Cluster) AddReplicas(ctx context.Context) error {
	first := c.Masters[0].Addr
	host, port, _ := strings.Cut(first, ":")
	for i, m := range c.Masters {
		nodeDir := ""
		if c.dir != "" {
			nodeDir = filepath.Join(c.dir, "replica"+strconv.Itoa(i))
		}
		srv, err := Start(ctx, Options{Dir: nodeDir, Args: nodeArgs()})
		if err != nil {
			return fmt.Errorf("replica %d: %w", i, err)
		}
		c.Replicas = append(c.Replicas, srv)
		id, err := nodeID(ctx, m.Addr)
		if err != nil {
			return err
		}
		rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
		defer rc.Close()
		if err := rc.ClusterMeet(ctx, host, port).Err(); err != nil {
			return fmt.Errorf("join replica %s: %w", srv.Addr, err)
		}
		// A node can replicate only a master it knows.
		err = poll(ctx, 30*time.Second, func() error {
			return rc.ClusterReplicate(ctx, id).Err()
		})
		if err != nil {
			return fmt.Errorf("replica %s of %s: %w", srv.Addr, m.Addr, err)
		}
	}
	for _, r := range c.Replicas {
		rc := redis.NewClient(&redis.Options{Addr: r.Addr})
		defer rc.Close()
		err := poll(ctx, 30*time.Second, func() error {
			info, err := rc.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "master_link_status:up") {
				return errors.New("replica not in sync")
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("replica %s: %w", r.Addr, err)
		}
	}
	return c.waitOK(ctx, append(c.Masters, c.Replicas...))
}

// Failover kills master i, as a crash would, and promotes its replica
// (CLUSTER FAILOVER TAKEOVER) in its place: Masters[i] becomes the
// promoted node, and Replicas[i] nil, as the master has no replica left. It returns once the surviving nodes
// report the cluster ok.
func (c *Cluster) Failover(ctx context.Context, i int) error {
	if i >= len(c.Replicas) || c.Replicas[i] == nil {
		return fmt.Errorf("master %d has no replica", i)
	}
	old, promoted := c.Masters[i], c.Replicas[i]
	rc := redis.NewClient(&redis.Options{Addr: promoted.Addr})
	defer rc.Close()
	if err := c.outrankMaster(ctx, i, rc); err != nil {
		return err
	}
	old.Kill()
	if err := rc.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		return fmt.Errorf("promote %s: %w", promoted.Addr, err)
	}
	err := poll(ctx, 30*time.Second, func() error {
		role, err := rc.Do(ctx, "ROLE").Slice()
		if err != nil {
			return err
		}
		if len(role) == 0 || role[0] != "master" {
			return fmt.Errorf("role %v", role)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("promote %s: %w", promoted.Addr, err)
	}
	c.Masters[i], c.Replicas[i] = promoted, nil
	var live []*Server
	for _, s := range append(c.Masters, c.Replicas...) {
		if s != nil {
			live = append(live, s)
		}
	}
	defer old.Close()
	return c.waitOK(ctx, live)
}

// outrankMaster has another master take a config epoch greater than
// master i's, as replica (a client of master i's replica) sees it.
// TAKEOVER gives the replica a new config epoch only if its own is not
// already the greatest it knows of; when master i's was, the replica
// could claim the slots at the failed master's epoch, which no node
// accepts, and the cluster stayed down (seen on a busy machine).
func (c *Cluster) outrankMaster(ctx context.Context, i int, replica *redis.Client) error {
	if len(c.Masters) < 2 {
		return nil
	}
	j := (i + 1) % len(c.Masters)
	mc := redis.NewClient(&redis.Options{Addr: c.Masters[i].Addr})
	defer mc.Close()
	oc := redis.NewClient(&redis.Options{Addr: c.Masters[j].Addr})
	defer oc.Close()
	idI, err := mc.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return fmt.Errorf("id of master %d: %w", i, err)
	}
	idJ, err := oc.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return fmt.Errorf("id of master %d: %w", j, err)
	}
	// BUMPEPOCH answers STILL when j's epoch is the greatest already.
	if err := oc.Do(ctx, "CLUSTER", "BUMPEPOCH").Err(); err != nil {
		return fmt.Errorf("bump the epoch of master %d: %w", j, err)
	}
	return poll(ctx, 30*time.Second, func() error {
		nodes, err := replica.ClusterNodes(ctx).Result()
		if err != nil {
			return err
		}
		epochs := nodeEpochs(nodes)
		if epochs[idJ] <= epochs[idI] {
			return fmt.Errorf("the replica sees master %d at epoch %d, master %d at %d", j, epochs[idJ], i, epochs[idI])
		}
		return nil
	})
}

// waitOK waits until every one of nodes reports cluster_state:ok and the
// same slot map owners.
func (c *Cluster) waitOK(ctx context.Context, nodes []*Server) error {
	for _, n := range nodes {
		cl := redis.NewClient(&redis.Options{Addr: n.Addr})
		defer cl.Close()
		err := poll(ctx, 60*time.Second, func() error {
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				nodes, _ := cl.ClusterNodes(ctx).Result()
				return fmt.Errorf("cluster state not ok; its view:\n%s", nodes)
			}
			slots, err := SlotMap(ctx, cl)
			if err != nil {
				return err
			}
			for _, s := range slots {
				if !c.isMaster(s.Master) {
					return fmt.Errorf("slots %d-%d served by %q, not a current master", s.Start, s.End, s.Master)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Addr, err)
		}
	}
	return nil
}

func (c *Cluster) isMaster(addr string) bool {
	for _, m := range c.Masters {
		if m.Addr == addr {
			return true
		}
	}
	return false
}

func nodeID(ctx context.Context, addr string) (string, error) {
	cl := redis.NewClient(&redis.Options{Addr: addr})
	defer cl.Close()
	id, err := cl.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return "", fmt.Errorf("node id of %s: %w", addr, err)
	}
	return id, nil
}

// poll calls f every 50ms until it succeeds, returning its last error
// after within.
func poll(ctx context.Context, within time.Duration, f func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// AddReplica gives master i a new replica, when it has none (after a
// Failover), and returns once it has synced with its master.
func (c *Cluster) AddReplica(ctx context.Context, i int) error {
	if i >= len(c.Masters) {
		return fmt.Errorf("no master %d", i)
	}
	for len(c.Replicas) < len(c.Masters) {
		c.Replicas = append(c.Replicas, nil)
	}
	if c.Replicas[i] != nil {
		return fmt.Errorf("master %d has a replica", i)
	}
	m := c.Masters[i]
	srv, err := Start(ctx, Options{Args: nodeArgs()})
	if err != nil {
		return fmt.Errorf("replica of master %d: %w", i, err)
	}
	id, err := nodeID(ctx, m.Addr)
	if err != nil {
		srv.Close()
		return err
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	host, port, _ := strings.Cut(m.Addr, ":")
	if err := rc.ClusterMeet(ctx, host, port).Err(); err != nil {
		srv.Close()
		return fmt.Errorf("join replica %s: %w", srv.Addr, err)
	}
	err = poll(ctx, 30*time.Second, func() error { return rc.ClusterReplicate(ctx, id).Err() })
	if err == nil {
		err = poll(ctx, 30*time.Second, func() error {
			info, err := rc.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "master_link_status:up") {
				return errors.New("replica not in sync")
			}
			return nil
		})
	}
	if err != nil {
		srv.Close()
		return fmt.Errorf("replica %s of %s: %w", srv.Addr, m.Addr, err)
	}
	c.Replicas[i] = srv
	return c.waitOK(ctx, c.live())
}

// HandOver is a graceful failover of master i (CLUSTER FAILOVER on its
// replica): the replica catches up, is promoted, and the old master
// becomes its replica, as an operator's planned switch does. Masters[i]
// and Replicas[i] swap. It returns once every node reports the cluster
// ok.
func (c *Cluster) HandOver(ctx context.Context, i int) error {
	if i >= len(c.Replicas) || c.Replicas[i] == nil {
		return fmt.Errorf("master %d has no replica", i)
	}
	old, promoted := c.Masters[i], c.Replicas[i]
	rc := redis.NewClient(&redis.Options{Addr: promoted.Addr})
	defer rc.Close()
	if err := rc.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		return fmt.Errorf("hand over to %s: %w", promoted.Addr, err)
	}
	err := poll(ctx, 30*time.Second, func() error {
		role, err := rc.Do(ctx, "ROLE").Slice()
		if err != nil {
			return err
		}
		if len(role) == 0 || role[0] != "master" {
			return fmt.Errorf("role %v", role)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("hand over to %s: %w", promoted.Addr, err)
	}
	c.Masters[i], c.Replicas[i] = promoted, old
	return c.waitOK(ctx, c.live())
}

// live is every node that runs.
func (c *Cluster) live() []*Server {
	var out []*Server
	for _, s := range append(append([]*Server(nil), c.Masters...), c.Replicas...) {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

// Resync brings Masters and Replicas back in line with the roles the
// nodes hold, which change behind the caller's back: a master paused
// past the node timeout is failed over by its replica, and comes back as
// its replica. Each master and its replica swap places when the replica
// is the one that serves. It returns once every live node reports the
// cluster ok with the slots served by the masters as it then knows them;
// while a failover is under way (both say master, or the slot map names
// a replica) it waits, up to a bound.
func (c *Cluster) Resync(ctx context.Context) error {
	role := func(s *Server) (string, error) {
		cl := redis.NewClient(&redis.Options{Addr: s.Addr})
		defer cl.Close()
		r, err := cl.Do(ctx, "ROLE").Slice()
		if err != nil {
			return "", err
		}
		if len(r) == 0 {
			return "", errors.New("empty ROLE")
		}
		name, _ := r[0].(string)
		return name, nil
	}
	return poll(ctx, 60*time.Second, func() error {
		for i := range c.Masters {
			if i >= len(c.Replicas) || c.Replicas[i] == nil {
				continue
			}
			m, err := role(c.Masters[i])
			if err != nil {
				return err
			}
			r, err := role(c.Replicas[i])
			if err != nil {
				return err
			}
			switch {
			case m == "master" && r != "master":
			case r == "master" && m != "master":
				c.Masters[i], c.Replicas[i] = c.Replicas[i], c.Masters[i]
			default:
				return fmt.Errorf("master %s is %s, its replica %s is %s", c.Masters[i].Addr, m, c.Replicas[i].Addr, r)
			}
		}
		for _, n := range c.live() {
			cl := redis.NewClient(&redis.Options{Addr: n.Addr})
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && !strings.Contains(info, "cluster_state:ok") {
				err = fmt.Errorf("node %s: cluster state not ok", n.Addr)
			}
			var slots []Slots
			if err == nil {
				slots, err = SlotMap(ctx, cl)
			}
			cl.Close()
			if err != nil {
				return err
			}
			for _, s := range slots {
				if !c.isMaster(s.Master) {
					return fmt.Errorf("node %s: slots %d-%d served by %q, not a current master", n.Addr, s.Start, s.End, s.Master)
				}
			}
		}
		return nil
	})
}
