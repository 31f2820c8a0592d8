package kafka

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
)

// The principals of TestEnsureTopicACLs, each with the ACLs docs/operations.md
// gives its role, on a broker that enforces them.
const (
	aclMech       = "SCRAM-SHA-512"
	aclTopic      = "session-timeouts"
	aclDLQ        = "session-timeouts-dlq"
	aclGroup      = "stillthere-guide"
	aclNewTopic   = "created-by-listener"
	aclNoneTopic  = "nobody-may-create"
	aclPassSuffix = "-pass-0123456789"
)

func allow(rt kmsg.ACLResourceType, name string, ops ...kmsg.ACLOperation) []kfake.ACL {
	out := make([]kfake.ACL, 0, len(ops))
	for _, op := range ops {
		out = append(out, kfake.ACL{Resource: rt, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true})
	}
	return out
}

func user(name string, acls ...[]kfake.ACL) kfake.Opt {
	var all []kfake.ACL
	for _, a := range acls {
		all = append(all, a...)
	}
	return kfake.User(aclMech, name, name+aclPassSuffix, all...)
}

// aclConfig is the Config a service of principal name runs with.
func aclConfig(cluster *kfake.Cluster, name, topic string) Config {
	c := valid()
	c.Brokers = cluster.ListenAddrs()
	c.Topic, c.Partitions = topic, 3
	c.SASLMechanism, c.SASLUsername, c.SASLPassword = SASLScramSHA512, name, name+aclPassSuffix
	return c
}

func aclClient(t *testing.T, c Config, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := NewClient(c, slog.New(slog.NewTextHandler(io.Discard, nil)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestEnsureTopicACLs runs EnsureTopic, and the produce and consume the
// services do after it, as principals holding only the ACLs their role
// needs, on a broker that authorizes every request. Kafka authorizes a
// create before it looks for the topic, so a service without CREATE must
// find an existing topic by describing it.
func TestEnsureTopicACLs(t *testing.T) {
	topic, group, cl := kmsg.ACLResourceTypeTopic, kmsg.ACLResourceTypeGroup, kmsg.ACLResourceTypeCluster
	const (
		read, write, describe, create = kmsg.ACLOperationRead, kmsg.ACLOperationWrite, kmsg.ACLOperationDescribe, kmsg.ACLOperationCreate
	)
	cluster, err := kafkatest.NewFake(kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(aclMech, "ops", "ops"+aclPassSuffix),
		user("listener", allow(topic, aclTopic, write, describe)),
		user("consumer", allow(topic, aclTopic, read, describe), allow(group, aclGroup, read), allow(topic, aclDLQ, write, describe)),
		user("creator", allow(topic, aclNewTopic, create, write, describe)),
		user("cluster-creator", allow(cl, "kafka-cluster", create), allow(topic, aclNewTopic+"-2", write, describe)),
		user("no-create", allow(topic, aclNoneTopic, write, describe)),
		user("stranger"),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Ops create the topics the restricted services use.
	ops := aclClient(t, aclConfig(cluster, "ops", aclTopic))
	for _, name := range []string{aclTopic, aclDLQ} {
		c := aclConfig(cluster, "ops", name)
		if err := EnsureTopic(ctx, ops, c); err != nil {
			t.Fatalf("ops create %s: %v", name, err)
		}
	}

	t.Run("listener with WRITE and DESCRIBE on the topic", func(t *testing.T) {
		c := aclConfig(cluster, "listener", aclTopic)
		// The listener's producer: idempotent, as franz-go's default is.
		prod := aclClient(t, c, kgo.DefaultProduceTopic(aclTopic), kgo.RequiredAcks(kgo.AllISRAcks()))
		if err := EnsureTopic(ctx, prod, c); err != nil {
			t.Fatalf("EnsureTopic: %v", err)
		}
		if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("u1"), Value: []byte("event")}).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	})

	t.Run("consumer with READ and DESCRIBE on the topic, READ on the group, WRITE and DESCRIBE on the dead-letter topic", func(t *testing.T) {
		c := aclConfig(cluster, "consumer", aclTopic)
		cons := aclClient(t, c, kgo.ConsumerGroup(aclGroup), kgo.ConsumeTopics(aclTopic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		dlq := c
		dlq.Topic = aclDLQ
		if err := EnsureTopic(ctx, cons, dlq); err != nil {
			t.Fatalf("EnsureTopic of the dead-letter topic: %v", err)
		}
		var got *kgo.Record
		for got == nil {
			fs := cons.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				t.Fatalf("consume: %v", err)
			}
			fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
			fs.EachRecord(func(r *kgo.Record) { got = r })
		}
		if err := cons.CommitUncommittedOffsets(ctx); err != nil {
			t.Fatalf("commit: %v", err)
		}
		if err := cons.ProduceSync(ctx, &kgo.Record{Topic: aclDLQ, Key: got.Key, Value: got.Value}).FirstErr(); err != nil {
			t.Fatalf("dead-letter: %v", err)
		}
	})

	partitionsOf := func(t *testing.T, name string) int {
		t.Helper()
		tds, err := kadm.NewClient(ops).ListTopics(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := tds[name].Err; err != nil {
			t.Fatalf("topic %s: %v", name, err)
		}
		return len(tds[name].Partitions)
	}
	for _, tc := range []struct{ user, topic string }{
		{"creator", aclNewTopic},                // CREATE on the topic
		{"cluster-creator", aclNewTopic + "-2"}, // CREATE on the cluster
	} {
		t.Run("missing topic is created by "+tc.user, func(t *testing.T) {
			c := aclConfig(cluster, tc.user, tc.topic)
			if err := EnsureTopic(ctx, aclClient(t, c), c); err != nil {
				t.Fatalf("EnsureTopic: %v", err)
			}
			if n := partitionsOf(t, tc.topic); n != c.Partitions {
				t.Errorf("created with %d partitions, want %d", n, c.Partitions)
			}
			// Once it exists, again is a no-op.
			if err := EnsureTopic(ctx, aclClient(t, c), c); err != nil {
				t.Fatalf("EnsureTopic again: %v", err)
			}
		})
	}

	t.Run("missing topic without CREATE", func(t *testing.T) {
		c := aclConfig(cluster, "no-create", aclNoneTopic)
		err := EnsureTopic(ctx, aclClient(t, c), c)
		if err == nil || !strings.Contains(err.Error(), `topic "`+aclNoneTopic+`" does not exist`) || !strings.Contains(err.Error(), "grant CREATE") {
			t.Fatalf("EnsureTopic = %v; want an error naming the topic and the CREATE it needs", err)
		}
	})

	t.Run("no DESCRIBE", func(t *testing.T) {
		c := aclConfig(cluster, "stranger", aclTopic)
		err := EnsureTopic(ctx, aclClient(t, c), c)
		if err == nil || !strings.Contains(err.Error(), `topic "`+aclTopic+`"`) || !strings.Contains(err.Error(), "grant DESCRIBE") {
			t.Fatalf("EnsureTopic = %v; want an error naming the topic and the DESCRIBE it needs", err)
		}
	})
}
