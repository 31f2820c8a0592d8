package expiry

import (
	"fmt"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// TestAttackOneGatewayCutLongerThanGrace: two gateway instances; the path
// of one of them to Redis is cut for twice the TTL, which is longer than
// the grace (as with the defaults: 2 x 60s > 75s). Its clients keep
// pinging every quarter TTL the whole time, and reconnect when their
// connection is closed, as real clients do; the listener reaches Redis
// throughout. Nobody who kept pinging may be guided; the one user who
// went silent before the cut gets one guide. The cut-off instance closes
// its connections after shed-after, so its clients move to the other.
func TestAttackOneGatewayCutLongerThanGrace(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// The defaults' ratio: a grace of 1.25 TTLs (75s to 60s), so a cut of
	// two TTLs outlasts it.
	const ttl = 4 * time.Second
	cfg := h.config(ModeSweep)
	cfg.OutageGrace = ttl * 5 / 4
	proxy, err := tcpproxy.Start(h.srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	shed := func(c *gateway.Config) { c.ShedAfter = time.Second }
	cutGW := h.startAttackGateway(proxy.Addr(), ttl, shed)
	okGW := h.startAttackGateway(h.srv.Addr, ttl, shed)
	stop := h.start(cfg)
	defer stop()

	var active []*pinger
	for i := range 5 {
		active = append(active, startMovingPinger(t, []*attackGateway{cutGW, okGW}, fmt.Sprintf("cut-%d", i), ttl/4))
		active = append(active, startPinger(t, okGW, fmt.Sprintf("ok-%d", i), ttl/4))
	}
	silent := startPinger(t, cutGW, "silent", 0) // pings once, then says nothing
	waitPongs(t, 2, active...)                   // everyone pinged twice
	waitPongs(t, 1, silent)

	proxy.Cut()
	// Real time must pass: the cut lasts two TTLs, longer than the grace.
	time.Sleep(2 * ttl)
	proxy.Restore()
	restored := h.redisNow()
	// The silent user's timeout, held for the grace after the cut, comes
	// out with any other of the cut gateway's; then one more sweep.
	eventually(waitLong+cfg.OutageGrace, func() bool { return len(byUID(h.events())["silent"]) > 0 })
	h.sweptPast(h.redisNow())
	for _, p := range active {
		p.stop()
	}
	stop()

	got := byUID(h.events())
	for uid, evs := range got {
		if uid != "silent" {
			t.Errorf("%s kept pinging every %v through the cut, yet got %d timeout event(s): deadline %v, produced at %v, %v before its gateway reached Redis again",
				uid, ttl/4, len(evs), time.UnixMilli(evs[0].DeadlineMS).Format("15:04:05.000"),
				time.UnixMilli(evs[0].DetectedMS).Format("15:04:05.000"), restored.Sub(time.UnixMilli(evs[0].DetectedMS)))
		}
	}
	if n := len(got["silent"]); n != 1 {
		t.Errorf("silent user: %d events, want 1", n)
	}
}

// TestAttackTwoDevicesViaIsLastRenewerOnly: "a user is present while any
// of their devices pings". A user has two devices: a phone on gateway A,
// pinging every quarter TTL, and a laptop on gateway B that pinged once,
// just after the phone, and is idle since (connected, no pings). Gateway
// A's path to Redis is then cut for two TTLs, well within the grace. The
// session's via is B, the last instance that renewed it, so the hold
// rules look only at B (alive) and not at A, whose users' deadlines would
// have been held: the phone, pinging all along, gets a guide while A is
// still cut off.
func TestAttackTwoDevicesViaIsLastRenewerOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const ttl = 2 * time.Second
	cfg := h.config(ModeSweep)
	// Twice the cut: only the via rule is at stake, and a busy host that
	// stalls the test's processes for seconds must not make the cut
	// outlast the grace (past it, a gateway's clients are to have
	// reconnected elsewhere, and a silence counts).
	cfg.OutageGrace = 8 * time.Second
	proxy, err := tcpproxy.Start(h.srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	gwA := h.startAttackGateway(proxy.Addr(), ttl, nil)
	gwB := h.startAttackGateway(h.srv.Addr, ttl, nil)
	stop := h.start(cfg)
	defer stop()

	phone := startPinger(t, gwA, "two-devices", ttl/4)
	onA := startPinger(t, gwA, "only-on-a", ttl/4)  // the same, with one device
	waitPongs(t, 2, phone, onA)                     // the phone's second ping is done
	laptop := startPinger(t, gwB, "two-devices", 0) // the laptop's one ping
	waitPongs(t, 1, laptop)
	proxy.Cut()
	cutAt := h.redisNow()
	// Real time must pass: the cut lasts two TTLs.
	time.Sleep(2 * ttl)
	proxy.Restore()
	if cut := h.redisNow().Sub(cutAt); cut >= cfg.OutageGrace {
		t.Fatalf("the cut lasted %v, past the grace %v: the host stalled the test, whose rule holds only within the grace", cut, cfg.OutageGrace)
	}
	// A deadline held for A's cut is checked again a grace after it.
	h.sweptPast(h.redisNow().Add(cfg.OutageGrace + time.Second))
	phone.stop()
	onA.stop()
	stop()

	got := byUID(h.events())
	if evs := got["two-devices"]; len(evs) > 0 {
		t.Errorf("two-devices: the phone pinged every %v through the cut, yet the user got %d timeout event(s): deadline %v, produced %v after the cut began (the cut lasted %v)",
			ttl/4, len(evs), time.UnixMilli(evs[0].DeadlineMS).Format("15:04:05.000"),
			time.UnixMilli(evs[0].DetectedMS).Sub(cutAt), 2*ttl)
	}
	if evs := got["only-on-a"]; len(evs) > 0 {
		t.Errorf("only-on-a: %d timeout event(s)", len(evs))
	}
}
