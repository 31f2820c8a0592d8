package gateway

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

func TestClassifyChannelMessages(t *testing.T) {
	const ch = "st:gw:a"
	for _, tc := range []struct {
		name string
		msg  any
		want channelEvent
	}{
		{"confirmed", &redis.Subscription{Kind: "ssubscribe", Channel: ch, Count: 1}, eventSubscribed},
		{"confirmed with none left", &redis.Subscription{Kind: "ssubscribe", Channel: ch, Count: 0}, eventOther},
		{"another channel confirmed", &redis.Subscription{Kind: "ssubscribe", Channel: "st:gw:b", Count: 1}, eventOther},
		{"slot moved", &redis.Subscription{Kind: "sunsubscribe", Channel: ch, Count: 0}, eventUnsubscribed},
		{"classic unsubscribe", &redis.Subscription{Kind: "unsubscribe", Channel: ch}, eventUnsubscribed},
		{"guide", &redis.Message{Channel: ch, Payload: `{"id":"g"}`}, eventGuide},
		{"probe", &redis.Message{Channel: ch, Payload: probePrefix + "abc"}, eventProbe},
		{"another channel's message", &redis.Message{Channel: "st:gw:b", Payload: `{}`}, eventOther},
		{"pong", &redis.Pong{}, eventOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := classify(tc.msg, ch); got != tc.want {
				t.Errorf("classify(%v) = %d, want %d", tc.msg, got, tc.want)
			}
		})
	}
}

func TestChannelRetry(t *testing.T) {
	if d := channelRetry(0); d != 0 {
		t.Errorf("first attempt after a loss waits %v, want none", d)
	}
	prev := time.Duration(0)
	for attempt := 1; attempt < 20; attempt++ {
		d := channelRetry(attempt)
		if d < prev || d > channelRetryMax || d <= 0 {
			t.Fatalf("attempt %d waits %v after %v; want growing, within (0, %v]", attempt, d, prev, channelRetryMax)
		}
		prev = d
	}
	if prev != channelRetryMax {
		t.Errorf("backoff ends at %v, want %v", prev, channelRetryMax)
	}
}

// TestInstanceChannelState: the subscription counts as subscribed only
// once confirmed; a probe's verdict names why it was lost; no probe runs
// while it is not subscribed.
func TestInstanceChannelState(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: no channel is given
	defer rdb.Close()
	newSub := func() *redis.PubSub { return rdb.SSubscribe(context.Background()) }
	var c instanceChannel
	sub := newSub()
	if !c.track(sub) {
		t.Fatal("track refused before stop")
	}
	c.up(sub)
	if err := c.err(); err != nil {
		t.Fatalf("confirmed, but %v", err)
	}
	got, payload, heard := c.startProbe()
	if got != sub || !strings.HasPrefix(payload, probePrefix) {
		t.Fatalf("probe of %p with %q, want of %p", got, payload, sub)
	}
	c.heardProbe(payload)
	select {
	case <-heard:
	default:
		t.Fatal("a probe read is not reported")
	}
	c.drop(sub, lostProbe)
	if _, p, _ := c.startProbe(); p != "" {
		t.Error("a probe started on a dropped subscription")
	}
	if why := c.down(sub, lostBroken); why != lostProbe {
		t.Errorf("lost for %q, want the probe's verdict %q", why, lostProbe)
	}
	if err := c.err(); err == nil || !strings.Contains(err.Error(), "instance channel") {
		t.Errorf("lost, but err %v", err)
	}
	next := newSub()
	c.track(next)
	if c.err() == nil {
		t.Error("subscribed before Redis confirmed it")
	}
	_, _, pending := c.startProbe()
	if pending != nil {
		t.Error("a probe started before Redis confirmed the subscription")
	}
	c.up(next)
	_, _, pending = c.startProbe()
	c.down(next, lostUnsubscribed)
	select {
	case <-pending:
	default:
		t.Error("the probe under way still waits on a subscription that is gone")
	}
	c.stop()
	if c.track(newSub()) {
		t.Error("tracked a subscription after stop")
	}
}

// TestChannelLostFailsReadiness: while the instance channel is not
// subscribed, and cannot be (here Redis refuses SSUBSCRIBE after the
// subscriber's connection was killed), readyz fails, and a guide routed
// to the instance meanwhile is answered retry, not taken for delivered.
// Once Redis takes the subscription again, the instance is ready, and the
// consumer's retry of the same guide delivers it, once.
func TestChannelLostFailsReadiness(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	a := startGatewayOn(t, []string{srv.Addr}, prefix, nil)
	b := startGatewayOn(t, []string{srv.Addr}, prefix, nil)
	admin := redistest.Client(t, srv)
	ctx := context.Background()
	ws := a.dial(t, "rita")
	pingPong(t, ws)
	b.mustPush(t, push.Request{ID: "before", UID: "rita", Text: "t"}, push.Delivered)
	readGuide(t, ws, "before")
	if code, body := get(t, a, "/readyz"); code != http.StatusOK {
		t.Fatalf("readyz before: %d %s", code, body)
	}

	lost := counterValue(t, metricChannelLost.WithLabelValues(lostBroken))
	if err := admin.Do(ctx, "ACL", "SETUSER", "default", "-ssubscribe").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "readyz to fail", func() bool {
		code, body := get(t, a, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "instance channel not subscribed")
	})
	if got := counterValue(t, metricChannelLost.WithLabelValues(lostBroken)); got < lost+1 {
		t.Errorf("channel_lost_total{reason=broken} %v, want at least %v", got, lost+1)
	}
	if v := gaugeValue(t, metricChannelSubscribed); v != 0 {
		t.Errorf("channel_subscribed %v while neither instance can subscribe, want 0", v)
	}
	if res, err := b.pushGuide(t, push.Request{ID: "gap", UID: "rita", Text: "t"}); err == nil {
		t.Fatalf("a guide routed to an instance not subscribed: %+v, want retry", res)
	}

	if err := admin.Do(ctx, "ACL", "SETUSER", "default", "+ssubscribe").Err(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "readyz to pass again", func() bool {
		code, _ := get(t, a, "/readyz")
		return code == http.StatusOK
	})
	// The consumer's retry: the first push released its claim.
	b.mustPush(t, push.Request{ID: "gap", UID: "rita", Text: "t"}, push.Delivered)
	readGuide(t, ws, "gap")
}

// gaugeValue reads a gauge.
func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// TestLetGoUnsubscribesReconnected: a subscription whose read fails is
// connected again by go-redis at once, and subscribed there, though
// nobody reads it any more: publishers count it, and a guide routed to
// it would be lost, counted as delivered. letGo takes it off before it
// is closed.
func TestLetGoUnsubscribesReconnected(t *testing.T) {
	tg := startGateway(t, nil)
	ctx := context.Background()
	name := tg.channelName()
	subscribers := func() int64 {
		t.Helper()
		v, err := tg.rdb.Do(ctx, "PUBSUB", "SHARDNUMSUB", name).Slice()
		if err != nil || len(v) != 2 {
			t.Fatalf("PUBSUB SHARDNUMSUB: %v %v", v, err)
		}
		return v[1].(int64)
	}
	if n := subscribers(); n != 1 {
		t.Fatalf("%d subscribers of the instance channel, want the gateway's own", n)
	}
	sub := tg.rdb.SSubscribe(ctx, name)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	// Kill the newest Pub/Sub connection: this subscription's.
	ids, err := tg.rdb.Do(ctx, "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		t.Fatal(err)
	}
	var newest int64
	for line := range strings.Lines(ids) {
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				if id, err := strconv.ParseInt(v, 10, 64); err == nil && id > newest {
					newest = id
				}
			}
		}
	}
	if err := tg.rdb.Do(ctx, "CLIENT", "KILL", "ID", newest).Err(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = sub.Receive(rctx)
	cancel()
	if err == nil {
		t.Fatal("a read on the killed connection did not fail")
	}
	waitUntil(t, "go-redis to subscribe the failed subscription again", func() bool { return subscribers() == 2 })
	tg.letGo(ctx, sub)
	if n := subscribers(); n != 1 {
		t.Fatalf("%d subscribers after letGo, want the gateway's own: a subscription nobody reads is counted by publishers", n)
	}
}
