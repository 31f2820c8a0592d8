package gateway

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

// TestPolicyTooShortForGranularity: a gateway that coalesces pings within
// its renewal granularity does not apply a stored policy with a TTL under
// twice that granularity (a client pinging just faster than the
// granularity would lapse), and keeps the policy in force.
func TestPolicyTooShortForGranularity(t *testing.T) {
	var logs lockedBuffer
	tg := startGatewayLogged(t, []string{redistest.Start(t).Addr}, redistest.Prefix(t),
		slog.New(slog.NewTextHandler(&logs, nil)), func(c *Config) { c.RenewGranularity = time.Second })
	store := policy.NewStore(tg.rdb, tg.store.Keyspace())
	ctx := context.Background()

	good := policy.Policy{DefaultTTL: 20 * time.Second, Segments: map[string]time.Duration{"vip": 3 * time.Minute}}
	if err := store.Save(ctx, good); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return tg.policy.Current().String() == good.String() }) {
		t.Fatal("the gateway did not pick up the policy within 5s")
	}

	// Stored as a gateway with a granularity of 500ms or less may have.
	bad := policy.Policy{DefaultTTL: 20 * time.Second, Segments: map[string]time.Duration{"vip": 1500 * time.Millisecond}}
	if err := store.Save(ctx, bad); err != nil {
		t.Fatal(err)
	}
	// A refresh met it and refused it; more refreshes, driven here, keep
	// refusing it without another warning.
	warnings := func() int { return strings.Count(logs.String(), "timeout policy in Redis not applied") }
	waitUntil(t, "the watcher to meet the policy stored", func() bool { return warnings() > 0 })
	for range 5 {
		if err := tg.policy.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A fresh connection's first ping is a renewal, granted by the policy
	// in force.
	if ttl := pingPong(t, tg.dialSegment(t, "v", "vip")); ttl != 180_000 {
		t.Fatalf("vip ttl_ms %v after a 1.5s TTL was stored, want the last good 180000", ttl)
	}
	if n := warnings(); n != 1 {
		t.Fatalf("%d warnings over some refreshes, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "segment vip TTL 1.5s: below twice the gateway's renewal granularity 1s") {
		t.Errorf("the warning does not give the reason:\n%s", logs.String())
	}
}
