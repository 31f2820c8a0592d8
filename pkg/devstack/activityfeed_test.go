package devstack

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/activityfeed"
	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/session"
)

// platform is a chat platform's server feeding the activity topic.
type platform struct {
	t  *testing.T
	cl *kgo.Client

	mu   sync.Mutex // guards what the produce callbacks record
	sent []delivery
	errs []error
}

// newPlatform's producer retries as docs/protocol.md asks of one: within
// the listener's grace after Kafka is back (our clients' backoff, at most
// 1.2 s), not franz-go's default, which doubles to 5 s, longer than the
// fault tests' grace: a busy host's producer then delivered the users'
// records of the outage after their deadlines were judged.
func newPlatform(t *testing.T, r *faultRig) *platform {
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers), kgo.DefaultProduceTopic(activityfeed.DefaultTopic),
		kgo.ProducerLinger(0), kgo.RetryBackoffFn(func(fails int) time.Duration { return kafka.RetryBackoff(fails, rand.Float64()) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &platform{t: t, cl: cl}
}

// send produces one event for uid, keyed by it, and returns the
// partition it went to.
func (p *platform) send(uid, event string) int32 {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec := &kgo.Record{Key: []byte(uid), Value: []byte(event)}
	if err := p.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		p.t.Errorf("produce for %s: %v", uid, err)
	}
	return rec.Partition
}

// TestActivityFeedStall: users kept active only through the activity
// topic, while the gateways cannot fetch it for twice the TTL, and a
// second gateway joining the group in the middle. A silence we caused is
// not a silence: none of the active users, nor those waiting for us, is
// guided; each user silent through it is guided once, after the feed
// caught up.
func TestActivityFeedStall(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault of twice the TTL")
	}
	t.Parallel()
	r := newFaultRig(t, rigOptions{Gateways: 1, ActivityFeed: true})
	store := session.NewStore(r.client(), r.keyspace())
	p := newPlatform(t, r)
	const n = 8
	active := func(i int) string { return fmt.Sprintf("active-%d", i) }
	silent := func(i int) string { return fmt.Sprintf("silent-%d", i) }
	waiting := func(i int) string { return fmt.Sprintf("waiting-%d", i) }
	for i := range n {
		p.send(active(i), fmt.Sprintf(`{"uid":%q,"kind":"active"}`, active(i)))
		p.send(silent(i), fmt.Sprintf(`{"uid":%q,"kind":"active"}`, silent(i)))
		p.send(waiting(i), fmt.Sprintf(`{"uid":%q,"kind":"turn","to":"us"}`, waiting(i)))
	}
	waitCond(t, 30*time.Second, "every user's session, from the topic alone", func() bool {
		for i := range n {
			for _, uid := range []string{active(i), silent(i), waiting(i)} {
				if live, err := store.Live(context.Background(), uid); err != nil || !live {
					return false
				}
			}
		}
		return true
	})

	// The active users act every quarter TTL until the end; the silent
	// ones stop now.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(faultTTL / 4)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for i := range n {
				p.send(active(i), fmt.Sprintf(`{"uid":%q,"kind":"active"}`, active(i)))
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()

	// The gateways cannot fetch the activity topic for twice the TTL; a
	// second gateway joins the group in the middle.
	fault := r.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: activityfeed.DefaultTopic, Count: -1})
	stalled := time.Now()
	time.Sleep(faultLength / 2) // the fault lasts: real time must pass
	r.startGateway()
	time.Sleep(faultLength / 2) // the rest of the fault, in real time too
	fault.Remove()
	t.Logf("activity fetches refused for %v", time.Since(stalled))

	// Every silent user gets a guide: once the feed caught up, after the
	// grace past the blind interval of its lag.
	waitCond(t, 60*time.Second, "a guide for every silent user", func() bool {
		for i := range n {
			if len(r.hook.Guides(silent(i))) == 0 {
				return false
			}
		}
		return true
	})
	// Once nothing is held, every timeout the listener judged is on the
	// topic; once each has its guide at the webhook, a guide to an active
	// or waiting user would be there too.
	r.waitHoldsReleased()
	waitCond(t, time.Minute, "a guide for every timeout produced", func() bool {
		for uid, evs := range r.events() {
			if len(r.hook.Guides(uid)) < len(evs) {
				return false
			}
		}
		return true
	})
	for i := range n {
		if gs := r.hook.Guides(silent(i)); len(gs) != 1 {
			t.Errorf("%s, silent through the stall: %d guides, want 1", silent(i), len(gs))
		} else if gs[0].At.Before(stalled.Add(faultLength)) {
			t.Errorf("%s guided at %v, before the feed caught up", silent(i), gs[0].At)
		}
		if gs := r.hook.Guides(active(i)); len(gs) != 0 {
			t.Errorf("%s, active through the topic all along: %d guides, want 0", active(i), len(gs))
		}
		if gs := r.hook.Guides(waiting(i)); len(gs) != 0 {
			t.Errorf("%s, waiting for us: %d guides, want 0", waiting(i), len(gs))
		}
	}
	var lag int
	for _, b := range r.outagesAfter(nil, nil, "").blind {
		if b.Reason == session.BlindActivityLag {
			lag++
		}
	}
	if lag == 0 {
		t.Error("no activity-lag blind interval for a stall of twice the TTL")
	}
}
