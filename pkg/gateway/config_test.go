package gateway

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestConfigClosing: close-after and close-text shape the default
// segment's stages of the policy a gateway holds while none is stored,
// and bad values name the setting.
func TestConfigClosing(t *testing.T) {
	load := func(env map[string]string) (Config, error) {
		return LoadConfig(nil, func(k string) (string, bool) {
			if v, ok := env[k]; ok {
				return v, true
			}
			return map[string]string{"STILLTHERE_TOKEN_SECRET": tokenSecret, "STILLTHERE_PUSH_SECRET": pushSecret}[k], true
		})
	}
	c, err := load(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []policy.Stage{
		{Action: timeoutevent.ActionRemind},
		{After: 3 * time.Minute, Action: timeoutevent.ActionClose, Text: policy.DefaultCloseText},
	}
	if got := c.FallbackPolicy().Stages("vip"); !slices.Equal(got, want) {
		t.Fatalf("default settings: stages %v, want %v", got, want)
	}
	if p := c.FallbackPolicy(); p.DefaultTTL != 60*time.Second || p.Jitter != 5*time.Second {
		t.Fatalf("default settings: fallback %v", p)
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
		{map[string]string{"STILLTHERE_CLOSE_AFTER": "100ms"}, "close-after: 100ms"},
		{map[string]string{"STILLTHERE_CLOSE_AFTER": "later"}, `STILLTHERE_CLOSE_AFTER="later"`},
		{map[string]string{"STILLTHERE_CLOSE_TEXT": strings.Repeat("x", 1025)}, "close-text: text of 1025 bytes"},
	} {
		if _, err := load(tt.env); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want an error about %q", tt.env, err, tt.want)
		}
	}
}

// TestGatewayHoldsConfiguredStages: a gateway started while no policy is
// stored holds the configured stages (what "gateway policy set" starts
// from), with its TTL.
func TestGatewayHoldsConfiguredStages(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.Closing = policy.Closing{After: 30 * time.Second, Text: "Closed."} })
	p := tg.policy.Current()
	want := []policy.Stage{{Action: timeoutevent.ActionRemind}, {After: 30 * time.Second, Action: timeoutevent.ActionClose, Text: "Closed."}}
	if got := p.Stages("default"); !slices.Equal(got, want) || p.TTL("default") != 10*time.Second {
		t.Fatalf("policy in force %v, stages %v; want %v", p, got, want)
	}
}
