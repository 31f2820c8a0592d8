package expiry

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestConfigClosing: the listener reads close-after and close-text as the
// gateways do, and policy-refresh; bad values name the setting.
func TestConfigClosing(t *testing.T) {
	load := func(env map[string]string) (Config, error) {
		return LoadConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	}
	c, err := load(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []policy.Stage{
		{Action: timeoutevent.ActionRemind},
		{After: 3 * time.Minute, Action: timeoutevent.ActionClose, Text: policy.DefaultCloseText},
	}
	if got := c.FallbackPolicy().Stages("vip"); !slices.Equal(got, want) || c.PolicyRefresh != 2*time.Second {
		t.Fatalf("defaults: stages %v, policy-refresh %v; want %v, 2s", got, c.PolicyRefresh, want)
	}
	c, err = load(map[string]string{"STILLTHERE_CLOSE_AFTER": "45s", "STILLTHERE_CLOSE_TEXT": "Bye.", "STILLTHERE_POLICY_REFRESH": "500ms"})
	if err != nil {
		t.Fatal(err)
	}
	want[1].After, want[1].Text = 45*time.Second, "Bye."
	if got := c.FallbackPolicy().Stages("default"); !slices.Equal(got, want) || c.PolicyRefresh != 500*time.Millisecond {
		t.Fatalf("from the environment: stages %v, policy-refresh %v", got, c.PolicyRefresh)
	}
	c, err = load(map[string]string{"STILLTHERE_CLOSE_AFTER": "0"})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.FallbackPolicy().Stages("default"); !slices.Equal(got, want[:1]) {
		t.Fatalf("close-after 0: stages %v, want one reminder", got)
	}

	for _, tt := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"STILLTHERE_CLOSE_AFTER": "999ms"}, "close-after: 999ms, want 0 (no close stage) or between 1s and 24h"},
		{map[string]string{"STILLTHERE_CLOSE_AFTER": "48h"}, "close-after: 48h0m0s"},
		{map[string]string{"STILLTHERE_CLOSE_TEXT": "\xff"}, "close-text"},
		{map[string]string{"STILLTHERE_POLICY_REFRESH": "10ms"}, "policy-refresh: 10ms"},
	} {
		if _, err := load(tt.env); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%v: %v, want an error starting %q", tt.env, err, tt.want)
		}
	}
	// Zero is the default, as in configs built in code.
	c.PolicyRefresh = 0
	if err := c.Validate(); err != nil {
		t.Errorf("policy-refresh 0: %v, want the default", err)
	}
}

// TestPolicyWatcher: the listener's watcher holds the configured stages
// while none is stored, picks up stored ones live, and applies stages of
// a policy whose TTLs are under a gateway's granularity bound.
func TestPolicyWatcher(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	ks, err := session.NewKeyspace(prefix)
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Redis: redisconn.Config{Addrs: []string{srv.Addr}, KeyPrefix: prefix},
		Closing: policy.Closing{After: 10 * time.Second, Text: "Closed."}, PolicyRefresh: 100 * time.Millisecond}
	rdb := redistest.Client(t, srv)
	w := c.NewPolicyWatcher(rdb, testLogger())
	ctx := context.Background()
	if err := w.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := w.Current().Stages("vip"); len(got) != 2 || got[1].After != 10*time.Second || got[1].Action != timeoutevent.ActionClose {
		t.Fatalf("none stored: stages %v, want the configured close after 10s", got)
	}

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.Run(wctx); close(done) }()
	defer func() { cancel(); <-done }()
	stored := policy.Policy{DefaultTTL: time.Second, SegmentStages: map[string][]policy.Stage{
		"vip": {{Text: "Still there?"}, {After: 2 * time.Second, Text: "Still with us?"}, {After: 3 * time.Second, Action: timeoutevent.ActionClose, Text: "Bye."}},
	}}
	if err := policy.NewStore(rdb, ks).Save(ctx, stored); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool { return slices.Equal(w.Current().Stages("vip"), stored.Stages("vip")) }) {
		t.Fatalf("the stored stages not picked up within 5s: %v", w.Current())
	}
	if got := w.Current().Stages("default"); len(got) != 1 {
		t.Errorf("stored policy without default stages: Stages(default) = %v, want one reminder", got)
	}
}
