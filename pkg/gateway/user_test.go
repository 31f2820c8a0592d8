package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/token"
)

func TestAdmit(t *testing.T) {
	for _, tt := range []struct {
		held, capacity int
		want           bool
	}{
		{0, 1, true},
		{0, 10, true},
		{9, 10, true},
		{10, 10, false},
		{11, 10, false}, // the cap lowered by a restart does not count below
	} {
		if got := admit(tt.held, tt.capacity); got != tt.want {
			t.Errorf("admit(%d, %d) = %v, want %v", tt.held, tt.capacity, got, tt.want)
		}
	}
}

func TestShareRenewal(t *testing.T) {
	const g = time.Second
	s := func(d float64) time.Duration { return time.Duration(d * float64(time.Second)) }
	for _, tt := range []struct {
		name        string
		at          time.Duration
		failed      bool
		since, now  time.Duration
		granularity time.Duration
		want        bool
		why         string
	}{
		{"within the granularity", s(10), false, s(1), s(10.5), g, true, "one renewal covers the user"},
		{"at the renewal", s(10), false, s(1), s(10), g, true, "a ping while another device's renewal is written waits for it"},
		{"past the granularity", s(10), false, s(1), s(11), g, false, "a renewal per granularity"},
		{"failed", s(10), true, s(1), s(10.5), g, false, "the ping tries again"},
		{"before the connection", s(10), false, s(10.2), s(10.5), g, false, "the session may have ended since; a new connection writes it back"},
		{"made as the connection registered", s(10), false, s(10), s(10.5), g, true, "registered first, then renewed"},
		{"no granularity", s(10), false, s(1), s(10), 0, false, "every ping renews"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := shareRenewal(tt.at, tt.failed, tt.since, tt.now, tt.granularity); got != tt.want {
				t.Errorf("shareRenewal = %v, want %v: %s", got, tt.want, tt.why)
			}
		})
	}
}

// TestRenewalsClaimAndSettle: a renewal being written is shared, its
// failure reaches its sharers, and the next ping renews again; segments
// do not share.
func TestRenewalsClaimAndSettle(t *testing.T) {
	var rs renewals
	var mu sync.Mutex
	r, own := rs.claim(&mu, "default", 0, 100, time.Second, 60*time.Second)
	if !own {
		t.Fatal("first ping shares a renewal")
	}
	shared, own := rs.claim(&mu, "default", 0, 200, time.Second, 61*time.Second)
	if own || shared != r {
		t.Fatal("a ping while a renewal is written does not share it")
	}
	if vip, own := rs.claim(&mu, "vip", 0, 200, time.Second, 120*time.Second); !own || vip == r {
		t.Fatal("a ping in another segment shares the default segment's renewal")
	}
	sawFailure := false
	rs.whenSettled(&mu, shared, func() { sawFailure = shared.failed() })
	rs.settle(&mu, r, time.Second, time.Time{}, errors.New("Redis out of reach"))
	if !sawFailure {
		t.Fatal("the sharer does not see the failure")
	}
	if again, own := rs.claim(&mu, "default", 0, 300, time.Second, 60*time.Second); !own || again == r {
		t.Fatal("a ping after a failed renewal does not renew")
	}
}

// TestUserConnectionCap: one user holds at most max-user-conns
// connections on an instance, counted before the upgrade, also when they
// race; beyond, HTTP 429 with a reason and a Retry-After, which a client
// tells apart from an instance at its limit (503). Others still connect,
// and a place freed is usable again.
func TestUserConnectionCap(t *testing.T) {
	const capacity = 3
	tg := startGateway(t, func(c *Config) { c.MaxUserConns = capacity })
	url := "ws://" + tg.PublicAddr().String() + "/v1/ws"
	tok, _ := token.Mint([]byte(tokenSecret), "mallory", "", time.Hour)
	hdr := http.Header{"Authorization": {"Bearer " + tok}}
	refused := counterValue(t, metricRejected.WithLabelValues("user_full"))

	// Ten at once: the check and the count are one step.
	var (
		mu     sync.Mutex
		opened []*websocket.Conn
		codes  []int
		wg     sync.WaitGroup
	)
	for range 10 {
		wg.Go(func() {
			ws, resp, err := websocket.DefaultDialer.Dial(url, hdr)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				opened = append(opened, ws)
				return
			}
			if resp == nil {
				t.Errorf("dial: %v", err)
				return
			}
			codes = append(codes, resp.StatusCode)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
				!strings.Contains(string(b), "user at its connection limit") {
				t.Errorf("refusal: HTTP %d, Retry-After %q, body %s; want 429 naming the user's limit, with a Retry-After",
					resp.StatusCode, resp.Header.Get("Retry-After"), b)
			}
		})
	}
	wg.Wait()
	for _, ws := range opened {
		t.Cleanup(func() { ws.Close() })
	}
	if len(opened) != capacity || len(codes) != 10-capacity {
		t.Fatalf("%d of 10 concurrent connections of one user opened, %d refused (%v); want %d opened", len(opened), len(codes), codes, capacity)
	}
	if got := counterValue(t, metricRejected.WithLabelValues("user_full")) - refused; got != 10-capacity {
		t.Errorf("rejected_total{reason=user_full} grew by %v, want %d", got, 10-capacity)
	}
	tg.dial(t, "alice") // another user is not refused

	// A place freed when one of the user's connections ends. Registered
	// first: one still being set up holds its place too.
	waitUntil(t, "the user's connections registered", func() bool { return tg.hub.count("mallory") == capacity })
	opened[0].Close()
	waitUntil(t, "the closed connection released", func() bool { return tg.hub.count("mallory") == capacity-1 })
	ws, _, err := websocket.DefaultDialer.Dial(url, hdr)
	if err != nil {
		t.Fatalf("connection after one was freed: %v", err)
	}
	ws.Close()
}

// TestRenewalsSharedAcrossDevices: a user's connections on an instance
// share their renewals: pings within the granularity of the last renewal
// in their segment cost no Redis write of their own, and each connection
// holds the grant it shares, for a resync or the dropped grants. A
// connection that registered after the last renewal renews on its first
// ping, and so does a connection in another segment.
func TestRenewalsSharedAcrossDevices(t *testing.T) {
	// A granularity far longer than the test, so that a busy machine
	// cannot let it pass between the pings.
	tg := startGateway(t, func(c *Config) {
		c.SessionTTL, c.RenewGranularity = 2*time.Minute, time.Minute
	})
	renewed := func() float64 { return counterValue(t, metricRenewals.WithLabelValues("ok")) }
	shared := func() float64 { return counterValue(t, metricRenewalsCoalesced) }
	devices := make([]*websocket.Conn, 4)
	for i := range devices {
		devices[i] = tg.dial(t, "dana")
	}
	waitUntil(t, "every device registered", func() bool { return tg.hub.count("dana") == len(devices) })
	r0, s0 := renewed(), shared()
	for range 2 {
		for _, ws := range devices {
			if ttl := pingPong(t, ws); ttl <= 60_000 || ttl > 121_000 {
				t.Fatalf("pong ttl_ms %v, want the grant of the user's renewal", ttl)
			}
		}
	}
	if got, coalesced := renewed()-r0, shared()-s0; got != 1 || coalesced != 7 {
		t.Fatalf("8 pings on 4 devices: %v renewals, %v shared; want 1 and 7", got, coalesced)
	}
	var at, ttl int64
	for i, c := range tg.hub.lookup("dana") {
		if i == 0 {
			at, ttl = c.pingAt.Load(), c.grant.Load()
		}
		if c.pingAt.Load() != at || c.grant.Load() != ttl || ttl <= 0 {
			t.Fatalf("device grants differ: ping at %v grant %v, and %v %v: a resync would not restore the shared grant",
				c.pingAt.Load(), c.grant.Load(), at, ttl)
		}
	}

	r0 = renewed()
	late := tg.dial(t, "dana")
	pingPong(t, late)
	vip := tg.dialSegment(t, "dana", "vip")
	pingPong(t, vip)
	if got := renewed() - r0; got != 2 {
		t.Fatalf("a new device's first ping and a ping in another segment: %v renewals, want 2", got)
	}
}

// TestAnyDeviceRenewsPastTheGranularity: past the granularity, a ping
// from any of the user's devices renews the session: sharing never loses
// a ping's presence.
func TestAnyDeviceRenewsPastTheGranularity(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.RenewGranularity = time.Second })
	phone, laptop := tg.dial(t, "erin"), tg.dial(t, "erin")
	waitUntil(t, "both devices registered", func() bool { return tg.hub.count("erin") == 2 })
	pingPong(t, phone)
	r0 := counterValue(t, metricRenewals.WithLabelValues("ok"))
	// Real time must pass: the granularity is the gateway's clock.
	time.Sleep(1100 * time.Millisecond)
	if ttl := pingPong(t, laptop); ttl < 10_000 {
		t.Fatalf("laptop's pong ttl_ms %v past the granularity, want a fresh grant", ttl)
	}
	if got := counterValue(t, metricRenewals.WithLabelValues("ok")) - r0; got != 1 {
		t.Fatalf("the laptop's ping past the granularity: %v renewals, want 1", got)
	}
	pttl, err := tg.rdb.PTTL(context.Background(), tg.store.Keyspace().SessionKey("erin")).Result()
	if err != nil || pttl < 9*time.Second {
		t.Fatalf("session PTTL %v (%v) after the laptop's ping: not renewed", pttl, err)
	}
}

// TestAllowFrame: the rate limit lets a burst through at once, then one
// frame per interval, and a connection idle long enough has its burst
// again.
func TestAllowFrame(t *testing.T) {
	const interval, burst = 200 * time.Millisecond, 3
	at := time.Duration(0)
	now := 10 * time.Second
	var ok bool
	for i := range burst {
		if at, ok = allowFrame(at, now, interval, burst); !ok {
			t.Fatalf("frame %d of a burst of %d refused", i+1, burst)
		}
	}
	if _, ok = allowFrame(at, now, interval, burst); ok {
		t.Fatal("a frame past the burst let through")
	}
	if at, ok = allowFrame(at, now+interval, interval, burst); !ok {
		t.Fatal("a frame an interval later refused")
	}
	if _, ok = allowFrame(at, now+interval, interval, burst); ok {
		t.Fatal("two frames in one interval past the burst let through")
	}
	now += time.Minute
	for i := range burst {
		if at, ok = allowFrame(at, now, interval, burst); !ok {
			t.Fatalf("after a minute idle, frame %d of the burst refused", i+1)
		}
	}
}
