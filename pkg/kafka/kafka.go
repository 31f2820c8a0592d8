// Package kafka sets up the franz-go clients the services use to reach the
// timeout topic, on the embedded broker or a real Kafka alike.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/stillthere/stillthere/pkg/config"
)

// Config says where Kafka is and what the timeout topic looks like.
type Config struct {
	// Brokers are the bootstrap servers, host:port. Default 127.0.0.1:9092.
	Brokers []string
	// Topic carries timeout events. Default "session-timeouts".
	Topic string
	// Partitions of the topic when the listener creates it. Default 12:
	// the consumer group scales up to this many replicas.
	Partitions int
	// ReplicationFactor of the topic when created. Default 1, right for
	// the embedded broker; use 3 on a real cluster.
	ReplicationFactor int
}

// Bind registers the Kafka settings.
func (c *Config) Bind(b *config.Binder) {
	b.List(&c.Brokers, "kafka-brokers", "127.0.0.1:9092", "Kafka bootstrap servers, comma-separated")
	b.String(&c.Topic, "topic", "session-timeouts", "topic of timeout events")
	b.Int(&c.Partitions, "topic-partitions", 12, "partitions of the topic, when it is created")
	b.Int(&c.ReplicationFactor, "topic-replication", 1, "replication factor of the topic, when it is created")
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("kafka-brokers: no address given")
	case c.Topic == "":
		return errors.New("topic: empty")
	case c.Partitions < 1:
		return fmt.Errorf("topic-partitions: %d, want at least 1", c.Partitions)
	case c.ReplicationFactor < 1:
		return fmt.Errorf("topic-replication: %d, want at least 1", c.ReplicationFactor)
	}
	return nil
}

// NewClient returns a client for the configured brokers that logs through
// logger. Extra options make it a producer or a group consumer.
func NewClient(c Config, logger *slog.Logger, opts ...kgo.Opt) (*kgo.Client, error) {
	all := append([]kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.WithLogger(kslog.New(logger.With("component", "kafka"))),
	}, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}

// EnsureTopic creates the topic unless it exists.
func EnsureTopic(ctx context.Context, cl *kgo.Client, c Config) error {
	adm := kadm.NewClient(cl)
	_, err := adm.CreateTopic(ctx, int32(c.Partitions), int16(c.ReplicationFactor), nil, c.Topic)
	if err == nil || errors.Is(err, kerr.TopicAlreadyExists) {
		return nil
	}
	return fmt.Errorf("create topic %q: %w", c.Topic, err)
}
