package canary

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const testSecret = "0123456789abcdef0123456789abcdef"

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLoadConfig(t *testing.T) {
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig([]string{"-canary-leavers", "7"}, envOf(map[string]string{
		"STILLTHERE_CANARY_URL":          "wss://chat.example.com/v1/ws",
		"STILLTHERE_TOKEN_SECRET":        "ignored: the file wins",
		"STILLTHERE_TOKEN_SECRET_FILE":   secretFile,
		"STILLTHERE_CANARY_STAGE_DELAYS": "20s, 1m",
		"STILLTHERE_CANARY_LEAVERS":      "5",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.TokenSecret != testSecret || c.Leavers != 7 || !slices.Equal(c.StageDelays, []time.Duration{20 * time.Second, time.Minute}) {
		t.Errorf("got %+v", c)
	}
	if c.TTL != 30*time.Second || c.Segment != "canary" || c.Stayers != 2 {
		t.Errorf("defaults: got %+v", c)
	}
	c, err = LoadConfig(nil, envOf(map[string]string{
		"STILLTHERE_CANARY_URL":          "ws://gw:8080/v1/ws",
		"STILLTHERE_TOKEN_SECRET":        testSecret,
		"STILLTHERE_CANARY_STAGE_DELAYS": "none",
	}))
	if err != nil || len(c.StageDelays) != 0 {
		t.Errorf("none: %v, %v; want one stage", c.StageDelays, err)
	}
}

// TestValidate: each bad setting is refused with its name.
func TestValidate(t *testing.T) {
	good := DefaultConfig()
	good.URL = "ws://gw:8080/v1/ws"
	good.TokenSecret = testSecret
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, tt := range []struct {
		field string
		edit  func(*Config)
	}{
		{"canary-url", func(c *Config) { c.URL = "" }},
		{"canary-url", func(c *Config) { c.URL = "http://gw/v1/ws" }},
		{"canary-activity-url", func(c *Config) { c.ActivityURL = "gw/v1/activity" }},
		{"activity-secret", func(c *Config) { c.ActivityURL = "http://gw:8081/v1/activity"; c.ActivitySecret = "short" }},
		{"canary-activity-url", func(c *Config) { c.FeedLeavers = 1 }},
		{"token-secret", func(c *Config) { c.TokenSecret = "" }},
		{"canary-segment", func(c *Config) { c.Segment = "no spaces" }},
		{"canary-ttl", func(c *Config) { c.TTL = time.Second }},
		{"canary-jitter", func(c *Config) { c.Jitter = -time.Second }},
		{"canary-stage-delays", func(c *Config) { c.StageDelays = []time.Duration{time.Millisecond} }},
		{"canary-leavers", func(c *Config) { c.Leavers = -1 }},
		{"canary-stayers", func(c *Config) { c.Stayers, c.Leavers = 0, 0 }},
		{"canary-leave-pings", func(c *Config) { c.LeavePings = 0 }},
		{"canary-slack", func(c *Config) { c.Slack = 0 }},
		{"canary-answer-timeout", func(c *Config) { c.AnswerTimeout = time.Minute }},
		{"canary-check-interval", func(c *Config) { c.CheckInterval = 0 }},
		{"canary-stay-for", func(c *Config) { c.StayFor = time.Hour }},
		{"canary-window", func(c *Config) { c.StageDelays = []time.Duration{20 * time.Minute} }},
		{"canary-uid-prefix", func(c *Config) { c.UIDPrefix = "a/b" }},
	} {
		c := good
		tt.edit(&c)
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), tt.field+":") {
			t.Errorf("%s: error %v, want one naming it", tt.field, err)
		}
	}
	if _, err := LoadConfig(nil, envOf(map[string]string{"STILLTHERE_CANARY_TTL": "soon"})); err == nil || !strings.Contains(err.Error(), "STILLTHERE_CANARY_TTL") {
		t.Errorf("a TTL that does not parse: %v, want an error naming STILLTHERE_CANARY_TTL", err)
	}
}

// TestCycleOutlastsItsStages: a leaver's cycle lasts past the bound of its
// last stage and the settle time, so that every stage it is owed is
// judged before its history ends.
func TestCycleOutlastsItsStages(t *testing.T) {
	c := DefaultConfig()
	p := c.promise()
	last := time.Duration(c.LeavePings)*c.pingEvery() + c.TTL + c.Jitter // the silence's latest deadline
	for _, d := range c.StageDelays {
		last += p.Slack + d // each stage at its bound at the latest
	}
	if bound := last + p.Slack + c.settle(); c.cycleTimeout() < bound {
		t.Errorf("cycle %v, want at least %v", c.cycleTimeout(), bound)
	}
}
