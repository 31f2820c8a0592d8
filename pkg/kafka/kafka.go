// Package kafka sets up the franz-go clients the services use to reach the
// timeout topic, on the embedded broker or a real Kafka alike, over TLS
// and with SASL when configured.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/tlsfiles"
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

	// TLS dials the brokers over TLS. Default false.
	TLS bool
	// TLSFiles are the CA, client certificate and server name of TLS. All
	// optional: the system roots verify the broker by the host dialed.
	TLSFiles tlsfiles.Files
	// SASLMechanism is none, plain, scram-sha-256 or scram-sha-512.
	// Default none. Any other needs SASLUsername and SASLPassword.
	SASLMechanism string
	// SASLUsername and SASLPassword authenticate with SASLMechanism.
	SASLUsername, SASLPassword string
}

// SASL mechanisms.
const (
	SASLNone        = "none"
	SASLPlain       = "plain"
	SASLScramSHA256 = "scram-sha-256"
	SASLScramSHA512 = "scram-sha-512"
)

// DefaultConfig is the Kafka settings by default: one local broker.
func DefaultConfig() Config {
	return Config{
		Brokers:           []string{"127.0.0.1:9092"},
		Topic:             "session-timeouts",
		Partitions:        12,
		ReplicationFactor: 1,
		SASLMechanism:     SASLNone,
	}
}

// Bind registers the Kafka settings.
func (c *Config) Bind(b *config.Binder) {
	d := DefaultConfig()
	b.String(&c.Topic, "topic", d.Topic, "topic of timeout events")
	b.Int(&c.Partitions, "topic-partitions", d.Partitions, "partitions of the topic, when it is created")
	b.Int(&c.ReplicationFactor, "topic-replication", d.ReplicationFactor, "replication factor of the topic, when it is created")
	c.BindClient(b)
}

// BindClient registers the settings of where Kafka is and how to reach
// it, without the timeout topic's: for a service that reads another topic.
func (c *Config) BindClient(b *config.Binder) {
	d := DefaultConfig()
	b.List(&c.Brokers, "kafka-brokers", strings.Join(d.Brokers, ","), "Kafka bootstrap servers, comma-separated")
	b.Bool(&c.TLS, "kafka-tls", false, "dial Kafka over TLS")
	b.String(&c.TLSFiles.CAFile, "kafka-tls-ca-file", "", "PEM CA bundle that verifies the brokers; empty uses the system roots")
	b.String(&c.TLSFiles.CertFile, "kafka-tls-cert-file", "", "PEM client certificate, for mutual TLS")
	b.String(&c.TLSFiles.KeyFile, "kafka-tls-key-file", "", "PEM key of the client certificate")
	b.String(&c.TLSFiles.ServerName, "kafka-tls-server-name", "", "name verified in the brokers' certificates; empty uses the host dialed")
	b.String(&c.SASLMechanism, "kafka-sasl-mechanism", d.SASLMechanism, "SASL mechanism: none, plain, scram-sha-256 or scram-sha-512")
	b.String(&c.SASLUsername, "kafka-sasl-username", "", "SASL user name")
	b.Secret(&c.SASLPassword, "kafka-sasl-password", "SASL password")
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
	if err := c.TLSFiles.Check("kafka-tls", c.TLS); err != nil {
		return err
	}
	switch c.SASLMechanism {
	case SASLNone, "":
		if c.SASLUsername != "" || c.SASLPassword != "" {
			return errors.New("kafka-sasl-username: a SASL user or password is set, but kafka-sasl-mechanism is none")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.SASLUsername == "" {
			return fmt.Errorf("kafka-sasl-username: empty, but kafka-sasl-mechanism is %s", c.SASLMechanism)
		}
		if c.SASLPassword == "" {
			return fmt.Errorf("kafka-sasl-password: empty, but kafka-sasl-mechanism is %s", c.SASLMechanism)
		}
	default:
		return fmt.Errorf("kafka-sasl-mechanism: %q, want none, plain, scram-sha-256 or scram-sha-512", c.SASLMechanism)
	}
	return nil
}

// securityOpts are the client options of TLS and SASL.
func (c Config) securityOpts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if c.TLS {
		tc, err := c.TLSFiles.Config("kafka-tls")
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	var m sasl.Mechanism
	switch c.SASLMechanism {
	case SASLPlain:
		m = plain.Auth{User: c.SASLUsername, Pass: c.SASLPassword}.AsMechanism()
	case SASLScramSHA256:
		m = scram.Auth{User: c.SASLUsername, Pass: c.SASLPassword}.AsSha256Mechanism()
	case SASLScramSHA512:
		m = scram.Auth{User: c.SASLUsername, Pass: c.SASLPassword}.AsSha512Mechanism()
	}
	if m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// NewClient returns a client for the configured brokers that logs through
// logger. Extra options make it a producer or a group consumer.
func NewClient(c Config, logger *slog.Logger, opts ...kgo.Opt) (*kgo.Client, error) {
	sec, err := c.securityOpts()
	if err != nil {
		return nil, err
	}
	all := append([]kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.WithLogger(kslog.New(logger.With("component", "kafka"))),
		kgo.RetryBackoffFn(func(fails int) time.Duration {
			return RetryBackoff(fails, rand.Float64())
		}),
	}, sec...)
	all = append(all, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}

// RetryBackoff is how long a client waits before its next try after fails
// consecutive failures (of a fetch, a produce, a metadata load, a group
// request): 100 ms doubling to at most 1 s, each scaled by 0.8 to 1.2 as
// r (in [0, 1)) says, so that clients cut off together do not come back
// in step. franz-go's default doubles from 250 ms to 5 s: after an outage
// of a few seconds a consumer or producer would wait up to 5 s more to
// see Kafka back, and every silence it held would be guided that late.
// A try a second is nothing to a broker, for the tens of clients a
// deployment has.
func RetryBackoff(fails int, r float64) time.Duration {
	const (
		first = 100 * time.Millisecond
		most  = time.Second
	)
	d := most
	if fails <= 4 { // 100, 200, 400, 800 ms
		d = first << max(fails-1, 0)
	}
	return min(time.Duration(float64(d)*(0.8+0.4*r)), most)
}

// EnsureTopic makes sure the topic exists: it describes the topic, and
// creates it only when the metadata says it is missing. Kafka authorizes a
// CreateTopics before it looks for the topic, so creating first would fail
// a client without CREATE even on a topic that ops created: with the
// least-privilege ACLs (WRITE or READ, which imply DESCRIBE) the describe
// alone settles it. Errors name the topic and the ACL that is missing.
func EnsureTopic(ctx context.Context, cl *kgo.Client, c Config) error {
	adm := kadm.NewClient(cl)
	described, err := adm.ListTopics(ctx, c.Topic)
	if isAuthErr(err) {
		return fmt.Errorf("describe topic %q: not authorized: grant DESCRIBE on it (WRITE or READ imply it): %w", c.Topic, err)
	}
	if err != nil {
		return fmt.Errorf("describe topic %q: %w", c.Topic, err)
	}
	td, ok := described[c.Topic]
	if ok && td.Err == nil {
		return nil
	}
	// Missing, or named with an error such as LEADER_NOT_AVAILABLE while
	// another client creates it: the create says which.
	_, err = adm.CreateTopic(ctx, int32(c.Partitions), int16(c.ReplicationFactor), nil, c.Topic)
	switch {
	case err == nil || errors.Is(err, kerr.TopicAlreadyExists):
		return nil
	case isAuthErr(err) && ok && !errors.Is(td.Err, kerr.UnknownTopicOrPartition):
		// The metadata named the topic, with a passing error such as
		// LEADER_NOT_AVAILABLE: it exists. Kafka authorizes a create
		// before it looks for the topic, so a principal without CREATE
		// is refused here all the same.
		return nil
	case isAuthErr(err):
		return fmt.Errorf("topic %q does not exist and this client may not create it: create it, or grant CREATE on the topic or the cluster: %w", c.Topic, err)
	}
	return fmt.Errorf("create topic %q: %w", c.Topic, err)
}

// isAuthErr reports whether err is the broker refusing an operation to this
// client's principal.
func isAuthErr(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed)
}
