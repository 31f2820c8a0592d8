package kafka

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
)

// TestEnsureTopicExistingTopicWithErrorNoCreate: the metadata names the
// topic, with a topic-level error that says it is there but not ready
// (LEADER_NOT_AVAILABLE: ops have just created it, or its leaders are
// being elected). A service without CREATE (the least-privilege ACLs
// docs/operations.md gives) then gets TOPIC_AUTHORIZATION_FAILED from the
// create, because Kafka authorizes a create before it looks for the topic;
// EnsureTopic's own comment expects "the create says which", which it
// cannot without CREATE. The issue: "An authorization error on create is
// fine when metadata shows the topic exists." Broken otherwise: the
// consumer refuses to start ("does not exist and this client may not
// create it", wrong on both counts) and its pod restarts; the listener
// spools and logs the same wrong advice.
func TestEnsureTopicExistingTopicWithErrorNoCreate(t *testing.T) {
	topic := kmsg.ACLResourceTypeTopic
	cluster, err := kafkatest.NewFake(kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(aclMech, "ops", "ops"+aclPassSuffix),
		user("listener", allow(topic, aclTopic, kmsg.ACLOperationWrite, kmsg.ACLOperationDescribe)),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ops := aclConfig(cluster, "ops", aclTopic)
	if err := EnsureTopic(ctx, aclClient(t, ops), ops); err != nil {
		t.Fatalf("ops create: %v", err)
	}

	// The next metadata request that names the topic answers that its
	// leader is not available yet; every other request is the broker's.
	cluster.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.MetadataRequest)
		named := false
		for _, rt := range req.Topics {
			named = named || (rt.Topic != nil && *rt.Topic == aclTopic)
		}
		if !named {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.MetadataResponse)
		resp.ControllerID = 0
		for i, addr := range cluster.ListenAddrs() {
			host, port := splitHostPort(t, addr)
			b := kmsg.NewMetadataResponseBroker()
			b.NodeID, b.Host, b.Port = int32(i), host, port
			resp.Brokers = append(resp.Brokers, b)
		}
		rt := kmsg.NewMetadataResponseTopic()
		rt.Topic = kmsg.StringPtr(aclTopic)
		rt.ErrorCode = kerr.LeaderNotAvailable.Code
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})

	c := aclConfig(cluster, "listener", aclTopic)
	if err := EnsureTopic(ctx, aclClient(t, c), c); err != nil {
		t.Fatalf("EnsureTopic on a topic that exists, as a principal without CREATE: %v", err)
	}
}

func splitHostPort(t *testing.T, addr string) (string, int32) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return host, int32(port)
}
