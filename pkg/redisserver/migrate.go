package redisserver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Resharding, as redis-cli --cluster reshard does it, one slot at a time:
// the target is told it imports the slot and the source that it migrates
// it, the keys move in batches with MIGRATE, and then every master is told
// the target owns it. While the keys are split between the two nodes,
// the source answers ASK for a key it no longer has, and both answer
// TRYAGAIN to a command of several keys they do not all hold: that is
// the state the tests hold a slot in, slowly, so that clients meet it.

// Migration is one slot moving between two masters. Begin it with
// BeginMigration, move keys with Move or MoveBatch, end it with Finish.
type Migration struct {
	c        *Cluster
	Slot     int
	from, to int // indexes in c.Masters
	src, dst *redis.Client
	dstHost  string
	dstPort  string
	srcID    string
	dstID    string
}

// SlotOf is the cluster slot of key, as a master computes it.
func (c *Cluster) SlotOf(ctx context.Context, key string) (int, error) {
	cl := redis.NewClient(&redis.Options{Addr: c.Masters[0].Addr})
	defer cl.Close()
	slot, err := cl.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return 0, fmt.Errorf("slot of %q: %w", key, err)
	}
	return int(slot), nil
}

// SlotOwner is the index in Masters of the master that serves slot, by
// the first master's view.
func (c *Cluster) SlotOwner(ctx context.Context, slot int) (int, error) {
	return c.slotOwnerSeenBy(ctx, c.Masters[0].Addr, slot)
}

func (c *Cluster) slotOwnerSeenBy(ctx context.Context, addr string, slot int) (int, error) {
	cl := redis.NewClient(&redis.Options{Addr: addr})
	defer cl.Close()
	slots, err := SlotMap(ctx, cl)
	if err != nil {
		return -1, fmt.Errorf("slot map of %s: %w", addr, err)
	}
	for _, s := range slots {
		if s.Start <= slot && slot <= s.End && s.Master != "" {
			for i, m := range c.Masters {
				if m.Addr == s.Master {
					return i, nil
				}
			}
			return -1, fmt.Errorf("slot %d served by %s, not a master of this cluster", slot, s.Master)
		}
	}
	return -1, fmt.Errorf("slot %d served by nobody, as %s sees it", slot, addr)
}

// BeginMigration opens the move of slot from the master that serves it
// to master to: IMPORTING on the target first, then MIGRATING on the
// source, so that no ASK points at a node not ready for it.
func (c *Cluster) BeginMigration(ctx context.Context, slot, to int) (*Migration, error) {
	if slot < 0 || slot > 16383 {
		return nil, fmt.Errorf("slot %d: want 0-16383", slot)
	}
	if to < 0 || to >= len(c.Masters) {
		return nil, fmt.Errorf("target master %d: want 0-%d", to, len(c.Masters)-1)
	}
	from, err := c.SlotOwner(ctx, slot)
	if err != nil {
		return nil, err
	}
	if from == to {
		return nil, fmt.Errorf("slot %d: master %d serves it already", slot, to)
	}
	m := &Migration{c: c, Slot: slot, from: from, to: to,
		src: redis.NewClient(&redis.Options{Addr: c.Masters[from].Addr}),
		dst: redis.NewClient(&redis.Options{Addr: c.Masters[to].Addr}),
	}
	m.dstHost, m.dstPort, _ = strings.Cut(c.Masters[to].Addr, ":")
	if m.srcID, err = nodeID(ctx, c.Masters[from].Addr); err != nil {
		m.close()
		return nil, err
	}
	if m.dstID, err = nodeID(ctx, c.Masters[to].Addr); err != nil {
		m.close()
		return nil, err
	}
	if err := m.dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.srcID).Err(); err != nil {
		m.close()
		return nil, fmt.Errorf("slot %d importing on %s: %w", slot, c.Masters[to].Addr, err)
	}
	if err := m.src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.dstID).Err(); err != nil {
		m.close()
		return nil, fmt.Errorf("slot %d migrating on %s: %w", slot, c.Masters[from].Addr, err)
	}
	return m, nil
}

func (m *Migration) close() {
	m.src.Close()
	m.dst.Close()
}

// Move migrates the given keys of the slot to the target in one MIGRATE.
// Keys the source does not hold (moved already, expired) are skipped.
func (m *Migration) Move(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	args := []any{"MIGRATE", m.dstHost, m.dstPort, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	err := m.src.Do(ctx, args...).Err()
	if err != nil && !strings.HasPrefix(err.Error(), "NOKEY") {
		return fmt.Errorf("migrate %d keys of slot %d: %w", len(keys), m.Slot, err)
	}
	return nil
}

// MoveBatch migrates up to n of the keys the source still holds in the
// slot, and returns how many it found: 0 means none is left.
func (m *Migration) MoveBatch(ctx context.Context, n int) (int, error) {
	keys, err := m.src.ClusterGetKeysInSlot(ctx, m.Slot, n).Result()
	if err != nil {
		return 0, fmt.Errorf("keys of slot %d: %w", m.Slot, err)
	}
	return len(keys), m.Move(ctx, keys...)
}

// Finish moves the keys left, waits until the masters' config epochs are
// settled, then gives the slot to the target on every master (the target
// first, then the source, as redis-cli does), and returns once every
// master names the target as its owner.
func (m *Migration) Finish(ctx context.Context) error {
	defer m.close()
	for {
		n, err := m.MoveBatch(ctx, 100)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
	}
	// The target's claim must outrank every other master's before any
	// node hears it (see epochs.go): with the epochs settled, the epoch
	// the target takes on closing the import, or keeps when its own is
	// the greatest, is greater than the source's, and no claim the
	// source sent before it is told can take the slot back.
	epochs, err := m.c.waitEpochsSettled(ctx)
	if err != nil {
		return fmt.Errorf("slot %d: %w", m.Slot, err)
	}
	if err := m.dst.Do(ctx, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.dstID).Err(); err != nil {
		return fmt.Errorf("give slot %d to %s on itself: %w", m.Slot, m.c.Masters[m.to].Addr, err)
	}
	text, err := m.dst.ClusterNodes(ctx).Result()
	if err != nil {
		return fmt.Errorf("cluster nodes of %s: %w", m.c.Masters[m.to].Addr, err)
	}
	seen := nodeEpochs(text)
	for id := range epochs {
		epochs[id] = seen[id]
	}
	if err := outranks(m.dstID, epochs); err != nil {
		return fmt.Errorf("slot %d given to %s: %w", m.Slot, m.c.Masters[m.to].Addr, err)
	}
	// Then the source, which stops claiming the slot, then the others,
	// which would learn it by gossip too, as redis-cli does.
	order := []int{m.from}
	for i := range m.c.Masters {
		if i != m.to && i != m.from {
			order = append(order, i)
		}
	}
	for _, i := range order {
		cl := redis.NewClient(&redis.Options{Addr: m.c.Masters[i].Addr})
		err := cl.Do(ctx, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.dstID).Err()
		cl.Close()
		if err != nil {
			return fmt.Errorf("give slot %d to %s on %s: %w", m.Slot, m.c.Masters[m.to].Addr, m.c.Masters[i].Addr, err)
		}
	}
	for _, srv := range m.c.Masters {
		err := poll(ctx, 30*time.Second, func() error {
			owner, err := m.c.slotOwnerSeenBy(ctx, srv.Addr, m.Slot)
			if err != nil {
				return err
			}
			if owner != m.to {
				return errors.New("slot " + strconv.Itoa(m.Slot) + " still served by master " + strconv.Itoa(owner))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("node %s: %w; the masters' views:\n%s", srv.Addr, err, m.c.views(ctx))
		}
	}
	return nil
}

// views is every master's CLUSTER NODES and current epoch, for an error
// that says how the cluster disagreed.
func (c *Cluster) views(ctx context.Context) string {
	var b strings.Builder
	for i, srv := range c.Masters {
		cl := redis.NewClient(&redis.Options{Addr: srv.Addr})
		nodes, err := cl.ClusterNodes(ctx).Result()
		info, _ := cl.ClusterInfo(ctx).Result()
		cl.Close()
		epoch := ""
		for line := range strings.Lines(info) {
			if strings.HasPrefix(line, "cluster_current_epoch:") {
				epoch = strings.TrimSpace(line)
			}
		}
		fmt.Fprintf(&b, "master %d (%s) %s %v:\n%s", i, srv.Addr, epoch, err, nodes)
	}
	return b.String()
}

// MigrateSlot moves slot to master to, batch keys at a time with a pause
// after each batch, and returns once every master names the target as
// its owner.
func (c *Cluster) MigrateSlot(ctx context.Context, slot, to, batch int, pause time.Duration) error {
	if batch < 1 {
		return fmt.Errorf("migration batch %d: want at least 1", batch)
	}
	m, err := c.BeginMigration(ctx, slot, to)
	if err != nil {
		return err
	}
	for {
		n, err := m.MoveBatch(ctx, batch)
		if err != nil {
			m.close()
			return err
		}
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			m.close()
			return ctx.Err()
		case <-time.After(pause):
		}
	}
	return m.Finish(ctx)
}
