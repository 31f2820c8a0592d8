// Package guide is the guide consumer: a Kafka consumer group that reads
// timeout events and sends each user one "are you still there?" through a
// circuit breaker, committing offsets only once a guide's outcome is
// settled.
package guide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/stillthere/stillthere/pkg/admin"
	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Consumer is a running guide consumer: open with New, then Run.
type Consumer struct {
	cfg     Config
	log     *slog.Logger
	rdb     redis.UniversalClient
	store   *session.Store
	client  *kgo.Client
	sender  *gatewaySender
	breaker *gobreaker.CircuitBreaker[string]
	adminLn net.Listener
}

// Run opens a consumer and runs it until ctx is done.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	c, err := New(ctx, cfg, logger)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// New connects to Redis and Kafka, joins the group and binds the admin
// listener.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("guide consumer config: %w", err)
	}
	rdb, err := redisconn.Open(ctx, cfg.Redis)
	if err != nil {
		return nil, err
	}
	c := &Consumer{
		cfg:   cfg,
		log:   logger,
		rdb:   rdb,
		store: session.NewStore(rdb, cfg.Redis.Keyspace()),
		sender: &gatewaySender{
			url:    cfg.PushURL,
			secret: cfg.PushSecret,
			client: &http.Client{Timeout: cfg.SendTimeout},
		},
	}
	c.breaker = gobreaker.NewCircuitBreaker[string](gobreaker.Settings{
		Name:        "gateway",
		MaxRequests: 1,
		Timeout:     cfg.BreakerTimeout,
		ReadyToTrip: func(n gobreaker.Counts) bool {
			return n.ConsecutiveFailures >= uint32(cfg.BreakerFailures)
		},
		// Our own shutdown and the downstream's definite "no" say nothing
		// about its health.
		IsExcluded: func(err error) bool {
			return errors.Is(err, context.Canceled) || isPermanent(err)
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			metricBreakerState.WithLabelValues(name).Set(float64(to))
			logger.Warn("circuit breaker state changed", "downstream", name, "from", from.String(), "to", to.String())
		},
	})
	metricBreakerState.WithLabelValues("gateway").Set(0)

	c.client, err = kafka.NewClient(cfg.Kafka, logger,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Kafka.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Only marked (settled) records are ever committed: with plain
		// DisableAutoCommit, CommitUncommittedOffsets would also commit
		// records polled but not yet settled, on revoke and at shutdown.
		kgo.AutoCommitMarks(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(c.commitOnRevoke),
	)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	if c.adminLn, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
		c.close()
		return nil, fmt.Errorf("listen on consumer-admin-addr: %w", err)
	}
	return c, nil
}

func (c *Consumer) close() {
	c.client.Close()
	c.rdb.Close()
	if c.adminLn != nil {
		c.adminLn.Close()
	}
}

// AdminAddr is where health and metrics are served.
func (c *Consumer) AdminAddr() net.Addr { return c.adminLn.Addr() }

// commitOnRevoke commits what was settled before partitions move to
// another member, so the new owner does not send those guides again.
func (c *Consumer) commitOnRevoke(ctx context.Context, cl *kgo.Client, _ map[string][]int32) {
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		c.log.Warn("commit on revoke", "err", err)
	}
}

// Run consumes until ctx is done, then commits what it settled and leaves
// the group.
func (c *Consumer) Run(ctx context.Context) error {
	defer c.close()
	c.log.Info("guide consumer running", "group", c.cfg.Group, "topic", c.cfg.Kafka.Topic,
		"push_url", c.cfg.PushURL, "admin", c.AdminAddr().String())
	eg, ctx := errgroup.WithContext(ctx)
	srv := &http.Server{Handler: admin.NewMux(c.ready), ReadHeaderTimeout: 5 * time.Second}
	eg.Go(func() error {
		if err := srv.Serve(c.adminLn); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	eg.Go(func() error {
		<-ctx.Done()
		return srv.Close()
	})
	eg.Go(func() error { return c.consume(ctx) })
	err := eg.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (c *Consumer) ready(ctx context.Context) error {
	if err := c.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if err := c.client.Ping(ctx); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	return nil
}

// pollMax bounds the records taken per poll.
const pollMax = 256

// consume is the poll loop. Records of a poll are settled in order, each
// retried until it is, and only then committed; a rebalance waits for the
// poll to be done (BlockRebalanceOnPoll), so a record is never sent by two
// members.
func (c *Consumer) consume(ctx context.Context) error {
	defer func() {
		// Commit what was settled before leaving the group.
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.client.CommitMarkedOffsets(cctx); err != nil {
			c.log.Warn("final commit", "err", err)
		}
	}()
	for {
		fetches := c.client.PollRecords(ctx, pollMax)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			c.client.AllowRebalance()
			return ctx.Err()
		}
		fetches.EachError(func(topic string, p int32, err error) {
			c.log.Warn("fetch", "topic", topic, "partition", p, "err", err)
		})
		var settled []*kgo.Record
		var stopErr error
		fetches.EachRecord(func(r *kgo.Record) {
			if stopErr != nil {
				return
			}
			if err := c.settle(ctx, r); err != nil {
				stopErr = err
				return
			}
			settled = append(settled, r)
		})
		if len(settled) > 0 {
			c.client.MarkCommitRecords(settled...)
			if err := c.client.CommitMarkedOffsets(context.WithoutCancel(ctx)); err != nil {
				c.log.Warn("commit", "err", err)
			}
		}
		c.client.AllowRebalance()
		if stopErr != nil {
			return stopErr
		}
	}
}

// settle decides one record's outcome, retrying failures with backoff
// until it is settled. It fails only when ctx is done.
func (c *Consumer) settle(ctx context.Context, r *kgo.Record) error {
	ev, err := timeoutevent.Parse(r.Value)
	if err != nil {
		metricGuides.WithLabelValues(OutcomeInvalid).Inc()
		c.log.Error("skip record that is not a timeout event", "partition", r.Partition, "offset", r.Offset, "err", err)
		return nil
	}
	log := c.log.With("uid", ev.UID, "guide_id", ev.ID)
	backoff := 50 * time.Millisecond
	for {
		outcome, err := c.attempt(ctx, ev)
		if err == nil {
			metricGuides.WithLabelValues(outcome).Inc()
			if outcome == OutcomeDelivered {
				metricEndToEnd.Observe(time.Since(ev.Deadline()).Seconds())
			}
			log.Info("guide settled", "outcome", outcome, "past_deadline", time.Since(ev.Deadline()).Round(time.Millisecond))
			return nil
		}
		if isPermanent(err) {
			metricGuides.WithLabelValues(OutcomeRejected).Inc()
			log.Error("guide rejected by downstream", "err", err)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		metricSendErrors.Inc()
		log.Warn("send guide, retrying", "err", err, "in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// attempt checks the user is still gone and sends the guide once.
func (c *Consumer) attempt(ctx context.Context, ev timeoutevent.Event) (string, error) {
	live, err := c.store.Live(ctx, ev.UID)
	if err != nil {
		return "", err
	}
	if live {
		return OutcomeStale, nil // they came back: no "are you still there?"
	}
	g := Guide{ID: ev.ID, UID: ev.UID, Segment: ev.Segment, Text: c.cfg.GuideText}
	return c.breaker.Execute(func() (string, error) {
		start := time.Now()
		defer func() { metricSendSeconds.Observe(time.Since(start).Seconds()) }()
		return c.sender.Send(ctx, g)
	})
}
