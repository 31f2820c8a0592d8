package gateway

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// TestCloseDuringOutageThenPingElsewhere: a user closes normally (1000)
// their last connection, on one instance, while Redis is out of reach, so
// the end waits in that instance's route writer; before Redis is back they
// connect to another instance and ping, which renews nothing yet. Whatever
// lands first when Redis returns, the end or the other instance's resync,
// the session lives on with the grant of that later ping: the user came
// back after they left, and their silence from then on is guided.
func TestCloseDuringOutageThenPingElsewhere(t *testing.T) {
	for _, tc := range []struct {
		name       string
		closeFirst bool // the closing instance reaches Redis again first
	}{
		{"the end lands first", true},
		{"the resync lands first", false},
	} {
		t.Run(tc.name, func(t *testing.T) { testCloseThenPingElsewhere(t, tc.closeFirst) })
	}
}

func testCloseThenPingElsewhere(t *testing.T, closeFirst bool) {
	const ttl = 30 * time.Second // far longer than the outage, on a busy machine too
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	direct := redistest.Client(t, srv) // the test's own view of Redis, never cut off
	startBehind := func(logs *lockedBuffer) (*testGateway, *tcpproxy.Proxy) {
		p, err := tcpproxy.Start(srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		tg := startGatewayLogged(t, []string{p.Addr()}, prefix, slog.New(slog.NewTextHandler(logs, nil)), func(c *Config) {
			c.SessionTTL, c.SessionJitter = ttl, 0
		})
		return tg, p
	}
	var laptopLogs, phoneLogs lockedBuffer
	laptopGW, laptopProxy := startBehind(&laptopLogs)
	phoneGW, phoneProxy := startBehind(&phoneLogs)
	ctx := context.Background()
	ks := laptopGW.store.Keyspace()
	const uid = "una"
	live := func() bool { return direct.Exists(ctx, ks.SessionKey(uid)).Val() == 1 }

	laptop := laptopGW.dial(t, uid)
	pingPong(t, laptop)
	waitUntil(t, "the laptop is in the route", func() bool {
		n, _ := direct.HGet(ctx, ks.RouteKey(uid), laptopGW.instance).Int()
		return n == 1
	})

	// Redis goes out of reach of both instances.
	laptopProxy.Cut()
	phoneProxy.Cut()
	closeNormally(laptop)
	waitUntil(t, "the laptop's connection is released", func() bool { return laptopGW.hub.count(uid) == 0 })
	if !live() {
		t.Fatal("the session ended while Redis was out of reach")
	}
	phone := phoneGW.dial(t, uid)
	pingFails(t, phone)
	pingAt := time.Now()

	first, second := laptopProxy, phoneProxy
	if !closeFirst {
		first, second = phoneProxy, laptopProxy
	}
	first.Restore()
	if closeFirst {
		waitUntil(t, "the laptop's end lands", func() bool { return !live() })
	} else {
		waitUntil(t, "the phone's resync", func() bool { return strings.Contains(phoneLogs.String(), `msg="resynced sessions"`) })
	}
	second.Restore()
	waitUntil(t, "the phone's resync", func() bool { return strings.Contains(phoneLogs.String(), `msg="resynced sessions"`) })
	waitUntil(t, "the laptop's route entry is gone", func() bool {
		return !direct.HExists(ctx, ks.RouteKey(uid), laptopGW.instance).Val()
	})

	if !live() {
		t.Fatalf("the session of a user who pinged after their normal close is gone (end landed first: %v): never guided", closeFirst)
	}
	ms, err := direct.ZScore(ctx, ks.IndexKey(session.Bucket(uid)), uid).Result()
	if err != nil {
		t.Fatalf("the session has no deadline: %v", err)
	}
	// The phone's ping was answered with an error within a second of it
	// being sent; its grant runs ttl from then, never later.
	if d := time.UnixMilli(int64(ms)); d.After(pingAt.Add(ttl)) || d.Before(pingAt.Add(ttl-2*time.Second)) {
		t.Fatalf("deadline %v from the phone's ping, want its grant of %v", d.Sub(pingAt), ttl)
	}
}
