package expiry

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttack26StaleOfCancelledHoldLost proves that a held lapse whose
// user came back is recorded as stale only by the in-memory timer of the
// listener replica that held it: a hold cancelled by a renewal while
// that replica restarts (a rolling deploy, a crash), or on a listener
// whose prefetch path is off (PrefetchInterval 0, a documented setting:
// "the sweep finds timeouts, as before it"), never gets its "rechecked"
// and "stale" entries. The timeline then ends at "held ..., recheck at
// X" and says nothing of X: the support question "why did nobody nudge
// this user?" has no answer, and the reader is left to guess whether the
// recheck ran. A witness user whose deadline falls after the hold's
// release is guided by the same replica, so that everything it recorded
// about the first user by then has reached Redis (one queue, in order).
func TestAttack26StaleOfCancelledHoldLost(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		restart bool // stop the replica that held it, and start another
		config  func(Config) Config
	}{
		{"replica restarted during the hold", true, func(c Config) Config { return c }},
		{"prefetch path off", false, func(c Config) Config { c.PrefetchInterval = 0; return c }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			start := h.redisNow()
			if err := h.store.RecordBlind(context.Background(), session.BlindInterval{
				Start: start, End: start.Add(time.Second), Reason: session.BlindFailover,
			}); err != nil {
				t.Fatal(err)
			}
			stop := h.start(c.config(h.config(ModeHybrid)))
			defer func() { stop() }()
			h.renew("user", "default", 500*time.Millisecond)
			es := h.waitTimeline("user", "lapse", "held:blind")
			release := time.UnixMilli(es[1].Until)
			if c.restart {
				stop()
			}
			h.renew("user", "default", time.Minute) // came back while held
			if c.restart {
				stop = h.start(c.config(h.config(ModeHybrid)))
			}
			// The witness falls due after the hold's release: once it is
			// produced, the replica has passed the release and flushed
			// what it recorded before.
			h.renew("witness", "default", release.Sub(h.redisNow())+500*time.Millisecond)
			h.waitTimelineEnd("witness", "produced")
			got := steps(h.timelineOf("user"))
			want := []string{"lapse", "held:blind", "rechecked", "stale:renewed"}
			if !slices.Equal(got, want) {
				logTimeline(t, h.timelineOf("user"))
				t.Fatalf("timeline of a held lapse whose user came back: %q, want %q", got, want)
			}
			if n := h.produced(); n != 1 {
				t.Fatalf("%d events, want the witness's one", n)
			}
		})
	}
}
