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

// TestConfigInstanceID: an instance id is written into values that split
// on "," (a session's via: the granter, then the last to renew), so one
// that holds a character outside [A-Za-z0-9._:@-] is refused, naming the
// setting; the default, from the host name, is always fit for one.
func TestConfigInstanceID(t *testing.T) {
	load := func(id string) error {
		_, err := LoadConfig(nil, func(k string) (string, bool) {
			return map[string]string{"STILLTHERE_TOKEN_SECRET": tokenSecret, "STILLTHERE_PUSH_SECRET": pushSecret,
				"STILLTHERE_INSTANCE_ID": id}[k], true
		})
		return err
	}
	for _, id := range []string{"", "gw-a", "gateway-7d9f8c6b5-x2k4p.eu:1", strings.Repeat("g", 128)} {
		if err := load(id); err != nil {
			t.Errorf("instance-id %q: %v", id, err)
		}
	}
	for _, id := range []string{"gw-a,gw-b", "gw a", "gw/a", strings.Repeat("g", 129), "gw\n"} {
		if err := load(id); err == nil || !strings.Contains(err.Error(), "instance-id") {
			t.Errorf("instance-id %q: %v, want it refused", id, err)
		}
	}
	for _, host := range []string{"", "node-1.eu", "odd,host", "x y", strings.Repeat("h", 200)} {
		if id := instanceIDOf(host); !validInstanceID(id) {
			t.Errorf("host %q: default instance id %q is not fit for one", host, id)
		}
	}
	if id := instanceIDOf("node-1.eu"); !strings.HasPrefix(id, "node-1.eu-") {
		t.Errorf("host node-1.eu: default instance id %q, want it named by the host", id)
	}
}
