// Package kafkatest starts an in-process Kafka (kfake) for tests, rigs
// and benches: one broker, and whatever else the caller's options add
// (seeded topics, SASL, ACLs, TLS, a data directory, a port).
package kafkatest

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// NewFake starts a one-broker in-process Kafka; the caller closes it.
func NewFake(opts ...kfake.Opt) (*kfake.Cluster, error) {
	return kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
}

// StartFake starts a one-broker in-process Kafka for tb, closed at its
// cleanup, and fails tb if it cannot.
func StartFake(tb testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	tb.Helper()
	c, err := NewFake(opts...)
	if err != nil {
		tb.Fatalf("start kfake: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}
