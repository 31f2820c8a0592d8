package activityfeed

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
)

// load binds the feed's settings and parses env as a gateway does.
func load(t *testing.T, env map[string]string) Config {
	t.Helper()
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	b := config.NewBinder(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	var c Config
	c.Bind(b)
	if err := b.Parse(nil); err != nil {
		t.Fatal(err)
	}
	return c.WithDefaults()
}

// TestGroupSessionTimeout: a member killed without leaving the group
// holds every deadline until the group's session timeout has passed, so
// the feed's is its own setting, shorter than franz-go's 45s, with a
// heartbeat well within it.
func TestGroupSessionTimeout(t *testing.T) {
	if c := load(t, nil); c.GroupSessionTimeout != 10*time.Second {
		t.Errorf("default group session timeout %v, want 10s", c.GroupSessionTimeout)
	}
	c := load(t, map[string]string{"STILLTHERE_ACTIVITY_GROUP_SESSION_TIMEOUT": "6s"})
	if c.GroupSessionTimeout != 6*time.Second {
		t.Fatalf("STILLTHERE_ACTIVITY_GROUP_SESSION_TIMEOUT=6s gave %v", c.GroupSessionTimeout)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("6s: %v", err)
	}
	for _, bad := range []time.Duration{500 * time.Millisecond, 5 * time.Second, time.Hour} {
		c.GroupSessionTimeout = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "activity-group-session-timeout") {
			t.Errorf("%v: error %v, want one naming activity-group-session-timeout", bad, err)
		}
	}
	for _, tt := range []struct{ session, beat time.Duration }{
		{10 * time.Second, time.Second},
		{6 * time.Second, 600 * time.Millisecond},
		{45 * time.Second, 3 * time.Second},
		{time.Second, 100 * time.Millisecond},
	} {
		if got := heartbeatInterval(tt.session); got != tt.beat {
			t.Errorf("heartbeatInterval(%v) = %v, want %v", tt.session, got, tt.beat)
		}
	}
}
