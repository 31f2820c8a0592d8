package guide

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The rebalance callbacks run on the client's group goroutine, never two
// at once. Each hands its partitions to the loop and waits for its answer;
// once the loop has stopped they do not wait.

func (c *Consumer) onAssigned(ctx context.Context, _ *kgo.Client, m map[string][]int32) {
	c.ask(ctx, assigned, m[c.cfg.Kafka.Topic])
}

// onRevoked commits what was settled once the revoked partitions' sends
// under way have finished, so their next owner starts right after it.
func (c *Consumer) onRevoked(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
	c.ask(ctx, revoked, m[c.cfg.Kafka.Topic])
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		c.log.Warn("commit on revoke", "err", err)
	}
}

func (c *Consumer) onLost(ctx context.Context, _ *kgo.Client, m map[string][]int32) {
	c.log.Warn("partitions lost", "partitions", m[c.cfg.Kafka.Topic])
	c.ask(ctx, lost, m[c.cfg.Kafka.Topic])
}

func (c *Consumer) ask(ctx context.Context, kind rebalanceKind, parts []int32) {
	if len(parts) == 0 {
		return
	}
	req := rebalanceReq{kind: kind, parts: parts, done: make(chan struct{})}
	select {
	case c.rebalance <- req:
	case <-c.loopDone:
		return
	case <-ctx.Done():
		return
	}
	select {
	case <-req.done:
	case <-c.loopDone:
	case <-ctx.Done():
	}
}

// lagInterval is how often consumer lag is read from the brokers.
const lagInterval = 5 * time.Second

// exportLag sets stillthere_consumer_lag for the partitions this member
// owns, so that summing over replicas counts each partition once.
func (c *Consumer) exportLag(ctx context.Context) error {
	adm := kadm.NewClient(c.client)
	mine := make(map[string]bool) // partition labels this member set
	t := time.NewTicker(c.lagEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			for p := range mine {
				metricLag.DeleteLabelValues(p)
			}
			return nil
		case <-t.C:
		}
		member, _ := c.client.GroupMetadata()
		lctx, cancel := context.WithTimeout(ctx, lagInterval)
		lags, err := adm.Lag(lctx, c.cfg.Group)
		cancel()
		if err != nil {
			c.log.Debug("read consumer lag", "err", err)
			continue
		}
		now := make(map[string]bool)
		for p, l := range lags[c.cfg.Group].Lag[c.cfg.Kafka.Topic] {
			if l.Member == nil || l.Member.MemberID != member || l.Lag < 0 {
				continue
			}
			label := strconv.Itoa(int(p))
			metricLag.WithLabelValues(label).Set(float64(l.Lag))
			now[label] = true
		}
		for p := range mine {
			if !now[p] {
				metricLag.DeleteLabelValues(p)
			}
		}
		mine = now
	}
}
