package guide

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/push"
)

// TestAttackPausedInstanceOpensBreakerForEveryone: a gateway pod pauses
// (a stalled VM, a long GC) while it holds several users. Their silences
// run out; the consumer pushes their guides to another, healthy gateway
// instance, which refuses each (503, retry) while the paused pod's
// heartbeat is late and its lease not out (routeAwake). The consumer
// counts each refusal as the gateway failing: a few in a row open its
// breaker, which pauses fetching for everyone for the breaker timeout.
// Users on healthy instances whose silences run out then wait that long
// for their guides, far beyond the paused pod's lease: the push was to
// wait "at most a lease, and only for the users of a paused instance".
// Run with the defaults that matter here: heartbeat 1 s (lease 3 s),
// breaker-failures 5, breaker-timeout 10 s.
func TestAttackPausedInstanceOpensBreakerForEveryone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := DefaultConfig()
	cfg := e.cfg
	cfg.BreakerFailures, cfg.BreakerTimeout = d.BreakerFailures, d.BreakerTimeout

	// A real gateway instance: the consumer's push goes to it.
	gcfg := gateway.TestConfig(e.cfg.Redis)
	gw, _ := lifecycletest.Start(t, gateway.Open, gcfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	cfg.PushURL = "http://" + gw.PushAddr().String() + push.Path
	cfg.PushSecret = gateway.TestPushSecret
	ks := e.store.Keyspace()
	r := e.start(cfg)
	// The consumer owns its partitions, and pushes: a guide of a user
	// connected nowhere is queued in their inbox.
	warm := uids("warm", 1)
	e.produce(warm...)
	waitFor(t, "the first guide queued", func() bool { return e.rdb.Exists(ctx, ks.InboxKey(warm[0])).Val() == 1 })

	// The paused pod: it beat once, with the production lease, and holds
	// a connection of each of its users.
	paused := "paused-pod-" + time.Now().Format("150405.000000")
	const lease = 3 * time.Second
	if _, err := e.store.Heartbeat(ctx, paused, lease); err != nil {
		t.Fatal(err)
	}
	beat := e.rdb.Time(ctx).Val() // Redis's clock, which heartbeats are judged by
	// It is subscribed to its channel and reads nothing: what it is
	// routed waits in its socket, counted as taken.
	sub := e.rdb.SSubscribe(ctx, ks.InstanceChannel(paused))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	onPaused := uids("onpaused", d.BreakerFailures)
	for _, uid := range onPaused {
		if err := e.rdb.HSet(ctx, ks.RouteKey(uid), paused, 1).Err(); err != nil {
			t.Fatal(err)
		}
	}
	opens0 := breakerOpens(t)
	// The pod misses its heartbeats: a beat and a half of its lease, by
	// Redis's clock.
	waitFor(t, "the paused pod's heartbeat to be late", func() bool {
		return e.rdb.Time(ctx).Val().After(beat.Add(lease/2 + 200*time.Millisecond))
	})
	e.produce(onPaused...)

	// Wait (bounded by the pod's lease) until either the breaker opened
	// or the paused pod's users' guides went through.
	settled := func(us []string) bool {
		for _, uid := range us {
			if e.rdb.Exists(ctx, ks.InboxKey(uid)).Val() == 0 {
				return false
			}
		}
		return true
	}
	holdsWithin(lease, func() bool { return breakerOpens(t) > opens0 || settled(onPaused) })

	// Users connected nowhere (their guides are queued in their
	// inboxes), whose silences run out now, on healthy instances.
	others := uids("healthy", 3)
	produced := time.Now()
	e.produce(others...)
	// Within the paused pod's lease from now, and a margin: by then the
	// pod is dead, and nobody waits for it.
	within := lease + time.Second
	if !holdsWithin(within, func() bool { return settled(others) }) {
		t.Fatalf("guides of users on no paused instance not settled %v after their silences ran out (breaker opened %v times, state %v): one paused pod's users' 503s opened the consumer's breaker for everyone, for its timeout (%v)",
			within, breakerOpens(t)-opens0, r.c.breaker.State(), cfg.BreakerTimeout)
	}
	t.Logf("others settled after %v", time.Since(produced))
}
