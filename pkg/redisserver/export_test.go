package redisserver

import "context"

// WaitEpochsSettled exposes waitEpochsSettled to the package's tests.
var WaitEpochsSettled = (*Cluster).waitEpochsSettled

// NodeEpochs exposes nodeEpochs to the package's tests.
var NodeEpochs = nodeEpochs

// SlotOwnerSeenBy is the owner of slot as master i sees it.
func (c *Cluster) SlotOwnerSeenBy(ctx context.Context, i, slot int) (int, error) {
	return c.slotOwnerSeenBy(ctx, c.Masters[i].Addr, slot)
}
