package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/expiry"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// pipelineOptions say what a pipelineRig is built on.
type pipelineOptions struct {
	// Cluster runs a 3-master Redis Cluster; otherwise one redis-server.
	Cluster bool
	// Gateways is the number of gateway instances.
	Gateways int
	// Sender is the consumer's downstream: guide.SenderWebhook (a
	// webhook behind a front that can answer 503) or guide.SenderGateway
	// (the first gateway's push endpoint, behind a proxy that can be
	// cut).
	Sender string
	// Policy, when set, is the timeout policy stored before any service
	// starts, so that every one has it from its first read.
	Policy *policy.Policy
}

// pipelineRig is a faultRig whose listener and consumer can be restarted
// (stopped, and a new one started with the same config, as a process
// restart does) and whose downstream can be made to fail.
type pipelineRig struct {
	*faultRig
	sender string
	// front stands before the webhook (webhook sender).
	front *flakyFront
	// push is the consumer's path to the push endpoint (gateway sender).
	push *tcpproxy.Proxy

	kafka    *kfake.Cluster
	lcfg     expiry.Config
	ccfg     guide.Config
	mu       sync.Mutex // guards listener and consumer
	listener *lifecycletest.Running
	consumer *lifecycletest.Running
}

func newPipelineRig(t *testing.T, opts pipelineOptions) *pipelineRig {
	t.Helper()
	r := newBareRig(t)
	ctx := context.Background()
	if opts.Cluster {
		r.cluster = redistest.StartCluster(t)
	} else {
		srv, err := redisserver.Start(ctx, redisserver.Options{Dir: t.TempDir()})
		if err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		t.Cleanup(func() { srv.Close() })
		r.redis = srv
	}
	if opts.Policy != nil {
		ks, err := session.NewKeyspace(r.prefix)
		if err != nil {
			t.Fatal(err)
		}
		if err := policy.NewStore(r.client(), ks).Save(ctx, *opts.Policy); err != nil {
			t.Fatal(err)
		}
	}
	kc := r.startKafka()
	for range opts.Gateways {
		r.startGateway()
	}
	p := &pipelineRig{faultRig: r, sender: opts.Sender, kafka: kc}

	var err error
	if p.lcfg, err = r.listenerConfig(); err != nil {
		t.Fatal(err)
	}
	cenv := map[string]string{
		"STILLTHERE_SENDER": opts.Sender,
		// A clean leave hands the partitions over at once; this bounds
		// a replica that did not leave.
		"STILLTHERE_GROUP_SESSION_TIMEOUT": "6s",
	}
	switch opts.Sender {
	case guide.SenderWebhook:
		p.front = startFlakyFront(t, r.hook.URL)
		cenv["STILLTHERE_WEBHOOK_URL"] = p.front.URL
		cenv["STILLTHERE_WEBHOOK_SECRET"] = r.hook.Secret
	default:
		p.push = startProxy(t, r.liveGateways()[0].gw.PushAddr().String())
		cenv["STILLTHERE_PUSH_URL"] = "http://" + p.push.Addr() + "/v1/push"
		// Notify stages go to the rig's webhook.
		cenv["STILLTHERE_NOTIFY_URL"] = r.hook.URL
		cenv["STILLTHERE_NOTIFY_SECRET"] = r.hook.Secret
	}
	if p.ccfg, err = r.consumerConfig(cenv); err != nil {
		t.Fatal(err)
	}
	// The listener creates the topic, so it opens before the consumer.
	p.startListener()
	p.startConsumer()
	p.warmUp()
	return p
}

func (p *pipelineRig) startListener() {
	p.t.Helper()
	if err := p.openListener(); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pipelineRig) startConsumer() {
	p.t.Helper()
	if err := p.openConsumer(); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pipelineRig) openListener() error {
	l, err := expiry.Open(context.Background(), p.lcfg, p.log.With("service", "expiry-listener"))
	if err != nil {
		return fmt.Errorf("open listener: %w", err)
	}
	svc := lifecycletest.Run(p.t, "expiry listener", l)
	p.mu.Lock()
	p.listener = svc
	p.mu.Unlock()
	return nil
}

func (p *pipelineRig) openConsumer() error {
	c, err := guide.Open(context.Background(), p.ccfg, p.log.With("service", "guide-consumer"))
	if err != nil {
		return fmt.Errorf("open consumer: %w", err)
	}
	svc := lifecycletest.Run(p.t, "guide consumer", c)
	p.mu.Lock()
	p.consumer = svc
	p.mu.Unlock()
	return nil
}

// restartListener stops the listener and starts a new one with the same
// config (spool directory included), as a process restart does. It may
// be called from any goroutine.
func (p *pipelineRig) restartListener() error {
	p.mu.Lock()
	old := p.listener
	p.mu.Unlock()
	if err := old.Stop(); err != nil {
		return fmt.Errorf("stop listener: %w", err)
	}
	p.log.Info("test: listener stopped, starting a new one")
	return p.openListener()
}

// restartConsumer stops the consumer (it commits what it settled and
// leaves the group) and starts a new one in the same group. It may be
// called from any goroutine.
func (p *pipelineRig) restartConsumer() error {
	p.mu.Lock()
	old := p.consumer
	p.mu.Unlock()
	if err := old.Stop(); err != nil {
		return fmt.Errorf("stop consumer: %w", err)
	}
	p.log.Info("test: consumer stopped, starting a new one")
	return p.openConsumer()
}

// failDownstream makes the consumer's sends fail until the returned
// function is called: the webhook answers 503, or the consumer's path to
// the push endpoint is cut.
func (p *pipelineRig) failDownstream() (heal func()) {
	p.log.Info("test: downstream fails")
	if p.front != nil {
		p.front.failing.Store(true)
		return func() { p.front.failing.Store(false); p.log.Info("test: downstream back") }
	}
	p.push.Cut()
	return func() { p.push.Restore(); p.log.Info("test: downstream back") }
}

// warmUp waits until a timeout goes through the whole pipeline, so that
// the consumer has joined its group before a test times guides.
func (p *pipelineRig) warmUp() {
	p.t.Helper()
	if p.sender == guide.SenderWebhook {
		p.faultRig.warmUp()
		return
	}
	// Pushed guides reach a connection: hold one and wait for its guide.
	c := p.dialUser("warm-up", 0)
	defer c.Close()
	pingConn(p.t, c)
	until := time.Now().Add(20 * time.Second)
	for {
		f, err := c.Next(time.Until(until))
		if err != nil {
			p.t.Fatalf("no guide went through the pipeline: %v", err)
		}
		if f.Type == "guide" {
			return
		}
	}
}

// dialUser connects uid to gateway instance i, directly (not through the
// instance's client proxy), and closes the connection at cleanup.
func (p *pipelineRig) dialUser(uid string, i int) *chatsim.Conn {
	p.t.Helper()
	return p.dialSegment(uid, "", i)
}

// dialSegment is dialUser for a user of segment seg ("" for the default).
func (p *pipelineRig) dialSegment(uid, seg string, i int) *chatsim.Conn {
	p.t.Helper()
	tok, err := chatsim.Token([]byte(p.tokenSecret), uid, seg)
	if err != nil {
		p.t.Fatal(err)
	}
	g := p.liveGateways()[i]
	u := &chatsim.User{UID: uid, Token: tok, Dialer: &websocket.Dialer{HandshakeTimeout: 5 * time.Second}}
	return connectAs(p.t, u, "ws://"+g.gw.PublicAddr().String()+"/v1/ws")
}

// flakyFront forwards the consumer's webhook requests to the receiver,
// or answers 503 while failing. It records when each guide id was first
// delivered (answered 2xx by the receiver), and which users' guides were
// refused.
type flakyFront struct {
	URL     string
	target  string
	failing atomic.Bool
	client  *http.Client

	mu        sync.Mutex
	delivered map[string]time.Time // guide id: first 2xx
	sends     map[string]int       // guide id: 2xx answers
	refused   map[string]int       // uid: 503s
}

func startFlakyFront(t *testing.T, target string) *flakyFront {
	f := &flakyFront{
		target:    target,
		client:    &http.Client{Timeout: 5 * time.Second},
		delivered: map[string]time.Time{},
		sends:     map[string]int{},
		refused:   map[string]int{},
	}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	t.Cleanup(f.client.CloseIdleConnections)
	f.URL = srv.URL + "/guides"
	return f
}

func (f *flakyFront) serve(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var g struct{ ID, UID string }
	json.Unmarshal(body, &g)
	if f.failing.Load() {
		f.mu.Lock()
		f.refused[g.UID]++
		f.mu.Unlock()
		http.Error(w, "failing on purpose", http.StatusServiceUnavailable)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, f.target, bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := f.client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode/100 == 2 {
		f.mu.Lock()
		if _, ok := f.delivered[g.ID]; !ok {
			f.delivered[g.ID] = at
		}
		f.sends[g.ID]++
		f.mu.Unlock()
	}
	w.WriteHeader(resp.StatusCode)
}

// firstDelivered is when guide id was first delivered, and whether it was.
func (f *flakyFront) firstDelivered(id string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.delivered[id]
	return at, ok
}

// refusals is how many of the user's guides were answered 503.
func (f *flakyFront) refusals(uid string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused[uid]
}

// resent counts the ids delivered more than once, and the extra sends.
func (f *flakyFront) resent() (ids, extra int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range f.sends {
		if n > 1 {
			ids++
			extra += n - 1
		}
	}
	return ids, extra
}
