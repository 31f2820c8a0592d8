package expiry

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a log sink the test reads while the listener writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestAttackListenerLogsQuietInRedisOutage: Redis is down for a few
// seconds. The issue: "Quiet logs in an outage: one line when it starts, a
// rate-limited summary, and one line when it ends. Not one warning per
// renewal or per record." The listener used to log a warning for every
// failed sweep, and one for every retry of the keyspace-event
// subscription: 39 lines for 12s. A regression test: it passes since
// sweeps and subscriptions log through outage logs.
func TestAttackListenerLogsQuietInRedisOutage(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeHybrid)
	cfg.SweepInterval = 200 * time.Millisecond // the default
	var logs syncBuffer
	_, stop := h.startListenerLogging(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	defer stop()
	h.waitSubscribed(1)
	h.sweptPast(h.redisNow()) // running: subscribed, sweeping

	before := strings.Count(logs.String(), "level=WARN")
	h.srv.Kill()
	// Real time must pass: the outage of the issue, 12s, with Redis down
	// (nothing to ask the time).
	time.Sleep(12 * time.Second)
	if err := h.srv.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Recovered: subscribed again, a whole sweep done since, and the
	// outage reported as a blind interval.
	h.waitSubscribed(1)
	h.sweptPast(h.redisNow())
	eventually(waitLong, func() bool { return strings.Contains(logs.String(), "users could not reach us") })
	out := logs.String()
	warns := strings.Count(out, "level=WARN") - before
	perSweep := strings.Count(out, `msg=sweep `)
	perRetry := strings.Count(out, `msg="keyspace events unavailable, retrying"`)
	// A start line per failing condition (sweep, marks, events) and a
	// blind interval on recovery: a handful.
	if warns > 6 {
		t.Errorf("%d warnings for one 12s Redis outage (%d 'sweep' lines, one per failed sweep; %d 'keyspace events unavailable' lines, one per retry), want a handful:\n%s",
			warns, perSweep, perRetry, out)
	}
}
