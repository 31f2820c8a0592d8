package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// keyPrefix is the run's Redis key prefix.
const keyPrefix = "nem"

// The stack's shape.
const (
	nGateways  = 3
	nListeners = 2
	nConsumers = 2
	nMasters   = 3
)

// errRefused is what kfake answers a refused request with: it closes the
// client's connection, as a broker that fails does.
var errRefused = errors.New("nemesis: refused")

// rig is the stack under test: a Redis Cluster of three masters with a
// replica each (child redis-servers), kfake in this process, and the
// three services as child processes from bin/. Users reach each gateway's
// public listener through a TCP proxy, activity posts reach its internal
// listener through another, and each consumer's pushes go through a relay
// (which can duplicate or reorder them) and a third.
type rig struct {
	s   settings
	dir string

	// redisMu serializes changes to the cluster's topology (failovers,
	// replicas, reshards): the schedule runs one Redis fault at a time,
	// and the report reads the masters.
	redisMu sync.Mutex
	cluster *redisserver.Cluster

	kafka         *kfake.Cluster
	refuseProduce atomic.Bool
	refuseFetch   atomic.Bool
	joins         atomic.Int64 // JoinGroup requests: each rebalance has some

	gateways, listeners, consumers []*service
	pub, act, push                 []*tcpproxy.Proxy // per gateway
	relays                         []*relay          // per consumer

	tokenSecret, pushSecret, activitySecret string

	// crowd is the run's users, for the faults that are theirs.
	crowd *crowd

	// exits counts processes that ended without the run asking (a
	// crash); the schedule's kills are not counted.
	exits    atomic.Int64
	expected sync.Map // *service -> generation the run itself ended

	closes []func()
}

func secret() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func startRig(ctx context.Context, s settings) (r *rig, err error) {
	r = &rig{s: s, tokenSecret: secret(), pushSecret: secret(), activitySecret: secret()}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.dir, err = os.MkdirTemp("", "nemesis-"); err != nil {
		return r, err
	}
	r.closes = append(r.closes, func() {
		if !s.keepLogs {
			os.RemoveAll(r.dir)
		}
	})

	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if r.cluster, err = redisserver.StartCluster(cctx, "", nMasters); err != nil {
		return r, fmt.Errorf("redis cluster: %w", err)
	}
	r.closes = append(r.closes, func() { r.cluster.Close() })
	if err = r.cluster.AddReplicas(cctx); err != nil {
		return r, fmt.Errorf("redis replicas: %w", err)
	}

	if r.kafka, err = kafkatest.NewFake(kfake.GroupMinSessionTimeout(time.Second)); err != nil {
		return r, err
	}
	r.closes = append(r.closes, r.kafka.Close)
	r.controlKafka()

	for i := range nGateways {
		if err := r.addGateway(i); err != nil {
			return r, err
		}
	}
	for i := range nListeners {
		if err := r.addListener(i); err != nil {
			return r, err
		}
	}
	for i := range nConsumers {
		if err := r.addConsumer(i, uint64(s.seed)); err != nil {
			return r, err
		}
	}
	r.closes = append(r.closes, r.stopAll)
	// The listeners create the topic, so they start before the consumers.
	for _, group := range [][]*service{r.gateways, r.listeners, r.consumers} {
		for _, svc := range group {
			if err := svc.start(ctx); err != nil {
				return r, err
			}
		}
	}
	return r, nil
}

// controlKafka installs kfake's hooks: refusals while a fault asks for
// them, and a count of group joins. A hook that does not handle a request
// stays for the next; one that does must ask to stay.
func (r *rig) controlKafka() {
	refuse := func(on *atomic.Bool) func(kmsg.Request) (kmsg.Response, error, bool) {
		return func(kmsg.Request) (kmsg.Response, error, bool) {
			if !on.Load() {
				return nil, nil, false
			}
			r.kafka.KeepControl()
			return nil, errRefused, true
		}
	}
	// A refused produce is answered, each partition with an error no
	// retry helps (the topic's authorization failed), so that the
	// producer gives up at once, as when a broker turns it away.
	r.kafka.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if !r.refuseProduce.Load() {
			return nil, nil, false
		}
		r.kafka.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, t := range req.Topics {
			rt := kmsg.NewProduceResponseTopic()
			rt.Topic = t.Topic
			rt.TopicID = t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition = p.Partition
				rp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})
	r.kafka.ControlKey(int16(kmsg.Fetch), refuse(&r.refuseFetch))
	r.kafka.ControlKey(int16(kmsg.JoinGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		r.joins.Add(1)
		return nil, nil, false
	})
}

// common are the settings every service reads.
func (r *rig) common() []string {
	return []string{
		"STILLTHERE_REDIS_ADDRS=" + strings.Join(r.cluster.Addrs(), ","),
		"STILLTHERE_REDIS_CLUSTER=true",
		"STILLTHERE_KEY_PREFIX=" + keyPrefix,
		"STILLTHERE_KAFKA_BROKERS=" + r.kafka.ListenAddrs()[0],
		"STILLTHERE_TOPIC_PARTITIONS=6",
		"STILLTHERE_CLOSE_AFTER=" + r.s.closeAfter.String(),
		"STILLTHERE_CLOSE_TEXT=We closed this chat.",
		"STILLTHERE_PUSH_SECRET=" + r.pushSecret,
		"STILLTHERE_LOG_FORMAT=json",
		"STILLTHERE_LOG_LEVEL=info",
	}
}

func (r *rig) logFile(name string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Join(r.dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(r.dir, "logs", name+".log"))
	if err != nil {
		return nil, err
	}
	r.closes = append(r.closes, func() { f.Close() })
	return f, nil
}

func (r *rig) newService(kind string, i int, bin string, env []string, extra func(int) []string, admin string) (*service, error) {
	name := fmt.Sprintf("%s-%d", kind, i)
	logs, err := r.logFile(name)
	if err != nil {
		return nil, err
	}
	return &service{name: name, kind: kind, bin: filepath.Join(r.s.bin, bin), env: env, extra: extra, seeds: r.redisSeeds,
		admin: admin, logs: logs, onExit: r.exited}, nil
}

// redisSeeds names the cluster's nodes as they are now, for a service
// that starts: hard failovers replace masters by new nodes, and after a
// few the first ones are all gone, as a deployment's seed list follows
// its nodes (a DNS name, a headless service).
func (r *rig) redisSeeds() []string {
	r.redisMu.Lock()
	defer r.redisMu.Unlock()
	var addrs []string
	for _, n := range append(r.cluster.Masters, r.cluster.Replicas...) {
		if n != nil {
			addrs = append(addrs, n.Addr)
		}
	}
	return []string{"STILLTHERE_REDIS_ADDRS=" + strings.Join(addrs, ",")}
}

// exited counts a process that ended when the run did not end it.
func (r *rig) exited(s *service, gen int) {
	if g, ok := r.expected.Load(s); ok && g.(int) >= gen {
		return
	}
	r.exits.Add(1)
}

// expect marks s's current start as one the run itself ends.
func (r *rig) expect(s *service) { r.expected.Store(s, s.generation()) }

func (r *rig) addGateway(i int) error {
	public, err := freeAddr()
	if err != nil {
		return err
	}
	internal, err := freeAddr()
	if err != nil {
		return err
	}
	for _, p := range []*[]*tcpproxy.Proxy{&r.pub, &r.act, &r.push} {
		target := internal
		if p == &r.pub {
			target = public
		}
		px, err := tcpproxy.Start(target)
		if err != nil {
			return err
		}
		r.closes = append(r.closes, func() { px.Close() })
		*p = append(*p, px)
	}
	env := append(r.common(),
		"STILLTHERE_TOKEN_SECRET="+r.tokenSecret,
		"STILLTHERE_ACTIVITY_SECRET="+r.activitySecret,
		"STILLTHERE_SESSION_TTL="+r.s.ttl.String(),
		"STILLTHERE_SESSION_JITTER=0s",
		"STILLTHERE_GATEWAY_ADDR="+public,
		"STILLTHERE_PUSH_ADDR="+internal,
	)
	svc, err := r.newService("gateway", i, "gateway", env, func(gen int) []string {
		return []string{fmt.Sprintf("STILLTHERE_INSTANCE_ID=nemesis-gw-%d-%d", i, gen)}
	}, internal)
	if err != nil {
		return err
	}
	r.gateways = append(r.gateways, svc)
	return nil
}

func (r *rig) addListener(i int) error {
	admin, err := freeAddr()
	if err != nil {
		return err
	}
	env := append(r.common(),
		"STILLTHERE_LISTENER_ADMIN_ADDR="+admin,
		"STILLTHERE_SPOOL_DIR="+filepath.Join(r.dir, fmt.Sprintf("spool-%d", i)),
		"STILLTHERE_OUTAGE_GRACE="+r.s.grace.String(),
		// A batch Kafka refuses goes to the spool within a refusal's
		// window (the default, 10 s, outlasts most).
		"STILLTHERE_PRODUCE_TIMEOUT=2s",
		// The brake engages at this run's scale: a fifth of the users
		// lapsing within a few seconds.
		"STILLTHERE_MASS_EXPIRY_FLOOR="+fmt.Sprint(max(4, r.s.users/6)),
		"STILLTHERE_MASS_EXPIRY_SHARE=0.2",
		"STILLTHERE_MASS_EXPIRY_WINDOW=4s",
	)
	svc, err := r.newService("listener", i, "expiry-listener", env, func(int) []string { return nil }, admin)
	if err != nil {
		return err
	}
	r.listeners = append(r.listeners, svc)
	return nil
}

func (r *rig) addConsumer(i int, seed uint64) error {
	admin, err := freeAddr()
	if err != nil {
		return err
	}
	rl, err := startRelay(r.push[i%nGateways].Addr(), seed+uint64(i))
	if err != nil {
		return err
	}
	r.closes = append(r.closes, rl.close)
	r.relays = append(r.relays, rl)
	env := append(r.common(),
		"STILLTHERE_CONSUMER_ADMIN_ADDR="+admin,
		"STILLTHERE_SENDER=gateway",
		"STILLTHERE_PUSH_URL=http://"+rl.addr+"/v1/push",
		"STILLTHERE_GROUP_SESSION_TIMEOUT="+groupSessionTimeout.String(),
	)
	svc, err := r.newService("consumer", i, "guide-consumer", env, func(int) []string { return nil }, admin)
	if err != nil {
		return err
	}
	r.consumers = append(r.consumers, svc)
	return nil
}

// groupSessionTimeout is how long a consumer that stopped heartbeating
// keeps its partitions.
const groupSessionTimeout = 6 * time.Second

// services are every service, gateways first.
func (r *rig) services() []*service {
	return append(append(append([]*service(nil), r.gateways...), r.listeners...), r.consumers...)
}

// stopAll drains every service, the consumers first.
func (r *rig) stopAll() {
	all := r.services()
	for i := len(all) - 1; i >= 0; i-- {
		r.expect(all[i])
		all[i].stop()
	}
}

// close stops everything, the last started first.
func (r *rig) close() {
	for i := len(r.closes) - 1; i >= 0; i-- {
		r.closes[i]()
	}
	r.closes = nil
}

// publicURL is gateway i's WebSocket URL, through its proxy.
func (r *rig) publicURL(i int) string { return "ws://" + r.pub[i].Addr() + "/v1/ws" }

// activityURL is gateway i's activity endpoint, through its proxy.
func (r *rig) activityURL(i int) string { return "http://" + r.act[i].Addr() + "/v1/activity" }
