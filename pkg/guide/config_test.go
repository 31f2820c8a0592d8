package guide

import (
	"context"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/userid"
)

func validConfig() Config {
	return Config{
		Redis:               redisconn.Config{Addrs: []string{"127.0.0.1:6379"}, KeyPrefix: "st"},
		Kafka:               kafka.Config{Brokers: []string{"127.0.0.1:9092"}, Topic: "session-timeouts", Partitions: 12, ReplicationFactor: 1},
		Timeline:            timeline.Settings{Bounds: session.TimelineBounds{Entries: 100, Keep: 24 * time.Hour}},
		AdminAddr:           "127.0.0.1:0",
		Group:               "stillthere-guide",
		GroupSessionTimeout: 10 * time.Second,
		DLQTopic:            "session-timeouts-dlq",
		Sender:              SenderGateway,
		PushURL:             "http://127.0.0.1:8081/v1/push",
		PushSecret:          strings.Repeat("s", 32),
		GuideText:           testText,
		GuideMaxAge:         time.Minute,
		MaxInFlight:         16,
		SendTimeout:         time.Second,
		BreakerFailures:     5,
		BreakerTimeout:      time.Second,
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		field string // the flag the error must name; empty means valid
		edit  func(*Config)
	}{
		{"valid", "", func(*Config) {}},
		{"https push url", "", func(c *Config) { c.PushURL = "https://gateway.internal/v1/push" }},
		{"smallest limits", "", func(c *Config) {
			c.PushSecret = strings.Repeat("s", 32)
			c.GuideText = strings.Repeat("x", 1024)
			c.SendTimeout = 10 * time.Millisecond
			c.BreakerFailures = 1
			c.BreakerTimeout = 100 * time.Millisecond
		}},
		{"no redis", "redis-addrs", func(c *Config) { c.Redis.Addrs = nil }},
		{"redis without port", "redis-addrs", func(c *Config) { c.Redis.Addrs = []string{"localhost"} }},
		{"bad key prefix", "key-prefix", func(c *Config) { c.Redis.KeyPrefix = "a:{b}" }},
		{"no brokers", "kafka-brokers", func(c *Config) { c.Kafka.Brokers = nil }},
		{"no topic", "topic", func(c *Config) { c.Kafka.Topic = "" }},
		{"timeline without entries", "timeline-entries", func(c *Config) { c.Timeline.Bounds.Entries = 0 }},
		{"timeline keep too short", "timeline-keep", func(c *Config) { c.Timeline.Bounds.Keep = time.Second }},
		{"empty push url", "push-url", func(c *Config) { c.PushURL = "" }},
		{"push url not http", "push-url", func(c *Config) { c.PushURL = "ftp://127.0.0.1/v1/push" }},
		{"push url without host", "push-url", func(c *Config) { c.PushURL = "http:///v1/push" }},
		{"push url without scheme", "push-url", func(c *Config) { c.PushURL = "127.0.0.1:8081/v1/push" }},
		{"no admin addr", "consumer-admin-addr", func(c *Config) { c.AdminAddr = "" }},
		{"no group", "consumer-group", func(c *Config) { c.Group = "" }},
		{"no secret", "push-secret", func(c *Config) { c.PushSecret = "" }},
		{"short secret", "push-secret", func(c *Config) { c.PushSecret = strings.Repeat("s", 31) }},
		{"no text", "guide-text", func(c *Config) { c.GuideText = "" }},
		{"long text", "guide-text", func(c *Config) { c.GuideText = strings.Repeat("x", 1025) }},
		{"send timeout too small", "send-timeout", func(c *Config) { c.SendTimeout = 9 * time.Millisecond }},
		{"no breaker failures", "breaker-failures", func(c *Config) { c.BreakerFailures = 0 }},
		{"breaker timeout too small", "breaker-timeout", func(c *Config) { c.BreakerTimeout = 99 * time.Millisecond }},
		{"webhook", "", func(c *Config) {
			c.Sender, c.PushSecret = SenderWebhook, ""
			c.WebhookURL, c.WebhookSecret = "https://im.example.com/hooks/guide", strings.Repeat("w", 32)
		}},
		{"unknown sender", "sender", func(c *Config) { c.Sender = "smtp" }},
		{"webhook without url", "webhook-url", func(c *Config) { c.Sender, c.WebhookSecret = SenderWebhook, strings.Repeat("w", 32) }},
		{"webhook url not http", "webhook-url", func(c *Config) {
			c.Sender, c.WebhookURL, c.WebhookSecret = SenderWebhook, "mailto:ops@example.com", strings.Repeat("w", 32)
		}},
		{"webhook short secret", "webhook-secret", func(c *Config) {
			c.Sender, c.WebhookURL, c.WebhookSecret = SenderWebhook, "http://im.internal/guide", strings.Repeat("w", 31)
		}},
		{"notify webhook", "", func(c *Config) {
			c.NotifyURL, c.NotifySecret = "https://app.example.com/hooks/away", strings.Repeat("n", 32)
		}},
		{"notify url without secret", "notify-secret", func(c *Config) { c.NotifyURL = "https://app.example.com/hooks/away" }},
		{"notify short secret", "notify-secret", func(c *Config) {
			c.NotifyURL, c.NotifySecret = "https://app.example.com/hooks/away", strings.Repeat("n", 31)
		}},
		{"notify url not http", "notify-url", func(c *Config) {
			c.NotifyURL, c.NotifySecret = "app.example.com/hooks/away", strings.Repeat("n", 32)
		}},
		{"notify secret without url", "notify-secret", func(c *Config) { c.NotifySecret = strings.Repeat("n", 32) }},
		{"notify secret without url, webhook sender", "notify-secret", func(c *Config) {
			c.Sender, c.PushSecret = SenderWebhook, ""
			c.WebhookURL, c.WebhookSecret = "https://im.example.com/hooks/guide", strings.Repeat("w", 32)
			c.NotifySecret = strings.Repeat("n", 32)
		}},
		{"notify url with the webhook's secret", "", func(c *Config) {
			c.Sender, c.PushSecret = SenderWebhook, ""
			c.WebhookURL, c.WebhookSecret = "https://im.example.com/hooks/guide", strings.Repeat("w", 32)
			c.NotifyURL = "https://app.example.com/hooks/away"
		}},
		{"no dlq topic", "dlq-topic", func(c *Config) { c.DLQTopic = "" }},
		{"dlq topic is the topic", "dlq-topic", func(c *Config) { c.DLQTopic = c.Kafka.Topic }},
		{"max age too small", "guide-max-age", func(c *Config) { c.GuideMaxAge = 999 * time.Millisecond }},
		{"no in-flight", "max-in-flight", func(c *Config) { c.MaxInFlight = 0 }},
		{"too many in flight", "max-in-flight", func(c *Config) { c.MaxInFlight = 100_001 }},
		{"session timeout too small", "group-session-timeout", func(c *Config) { c.GroupSessionTimeout = 500 * time.Millisecond }},
		{"templates", "", func(c *Config) { c.GuideTemplates = "new=Still with us?, vip = Anything else? ," }},
		{"template without text", "guide-templates", func(c *Config) { c.GuideTemplates = "new=" }},
		{"template without =", "guide-templates", func(c *Config) { c.GuideTemplates = "Still with us?" }},
		{"template for a bad segment", "guide-templates", func(c *Config) { c.GuideTemplates = "n w=hi" }},
		{"template twice", "guide-templates", func(c *Config) { c.GuideTemplates = "new=a,new=b" }},
		{"template too long", "guide-templates", func(c *Config) { c.GuideTemplates = "new=" + strings.Repeat("x", 1025) }},
		{"template file missing", "guide-templates", func(c *Config) { c.GuideTemplates = "@/nonexistent/templates.json" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.edit(&c)
			err := c.Validate()
			switch {
			case tt.field == "" && err != nil:
				t.Fatalf("Validate: %v; want nil", err)
			case tt.field != "" && err == nil:
				t.Fatalf("Validate: nil; want an error naming %s", tt.field)
			case tt.field != "" && !strings.HasPrefix(err.Error(), tt.field+":"):
				t.Fatalf("Validate: %v; want it to name %s", err, tt.field)
			}
		})
	}
}

func TestPprofSetting(t *testing.T) {
	for value, want := range map[string]bool{"": false, "false": false, "true": true} {
		env := map[string]string{"STILLTHERE_PUSH_SECRET": strings.Repeat("s", 32), "STILLTHERE_PPROF": value}
		c, err := LoadConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil || c.Pprof != want {
			t.Errorf("STILLTHERE_PPROF=%q: Pprof %v, %v; want %v", value, c.Pprof, err, want)
		}
	}
}

func TestTemplates(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return "@" + path
	}
	tests := []struct {
		name string
		spec string
		want map[string]string // nil means an error naming guide-templates
	}{
		{"none", "", map[string]string{}},
		{"inline", "new=Still with us?,vip=Anything else?", map[string]string{"new": "Still with us?", "vip": "Anything else?"}},
		{"text with =", "new=a=b", map[string]string{"new": "a=b"}},
		{"file", write("ok.json", `{"new":"Hi, still there?","vip":"Take your time."}`), map[string]string{"new": "Hi, still there?", "vip": "Take your time."}},
		{"file not json", write("bad.json", `new=hi`), nil},
		{"file with a bad segment", write("seg.json", `{"a b":"hi"}`), nil},
		{"file with an empty text", write("empty.json", `{"new":""}`), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Config{GuideTemplates: tt.spec}.templates()
			if tt.want == nil {
				if err == nil || !strings.HasPrefix(err.Error(), "guide-templates:") {
					t.Fatalf("templates(%q) = %v, %v; want an error naming guide-templates", tt.spec, got, err)
				}
				return
			}
			if err != nil || !maps.Equal(got, tt.want) {
				t.Fatalf("templates(%q) = %v, %v; want %v", tt.spec, got, err, tt.want)
			}
		})
	}
}

func FuzzParseTemplates(f *testing.F) {
	for _, s := range []string{"", "new=Still with us?,vip=Anything else?", "a=b=c", "=x", "new=", ",,,", "n w=x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		m, err := parseTemplates(spec)
		if err != nil {
			return
		}
		for seg, text := range m {
			if !userid.ValidSegment(seg) || text == "" || len(text) > maxGuideText || strings.Contains(text, ",") {
				t.Fatalf("parseTemplates(%q) accepted %q=%q", spec, seg, text)
			}
		}
	})
}

func TestLoadConfig(t *testing.T) {
	secret := strings.Repeat("s", 32)
	t.Run("defaults", func(t *testing.T) {
		got, err := LoadConfig(nil, mapLookup(map[string]string{"STILLTHERE_PUSH_SECRET": secret}))
		if err != nil {
			t.Fatal(err)
		}
		// Redis and Kafka defaults are their packages' to test.
		want := Config{
			Redis:               got.Redis,
			Kafka:               got.Kafka,
			Timeline:            timeline.Settings{Bounds: session.TimelineBounds{Entries: 100, Keep: 24 * time.Hour}},
			AdminAddr:           "127.0.0.1:8083",
			Group:               "stillthere-guide",
			GroupSessionTimeout: 45 * time.Second,
			DLQTopic:            "session-timeouts-dlq",
			Sender:              SenderGateway,
			PushURL:             "http://127.0.0.1:8081/v1/push",
			PushSecret:          secret,
			GuideText:           "Are you still there?",
			GuideMaxAge:         5 * time.Minute,
			MaxInFlight:         256,
			SendTimeout:         5 * time.Second,
			BreakerFailures:     5,
			BreakerTimeout:      10 * time.Second,
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("LoadConfig defaults:\n got %+v\nwant %+v", got, want)
		}
	})
	t.Run("flag beats env", func(t *testing.T) {
		env := mapLookup(map[string]string{"STILLTHERE_PUSH_SECRET": secret, "STILLTHERE_BREAKER_FAILURES": "3"})
		got, err := LoadConfig([]string{"-breaker-failures=7", "-send-timeout=250ms"}, env)
		if err != nil {
			t.Fatal(err)
		}
		if got.BreakerFailures != 7 || got.SendTimeout != 250*time.Millisecond {
			t.Errorf("breaker-failures %d, send-timeout %v; want the flags' 7 and 250ms", got.BreakerFailures, got.SendTimeout)
		}
	})
	t.Run("errors", func(t *testing.T) {
		tests := []struct {
			name string
			args []string
			env  map[string]string
			want string // in the error
		}{
			{"secret required", nil, nil, "push-secret"},
			{"bad env duration", nil, map[string]string{"STILLTHERE_PUSH_SECRET": secret, "STILLTHERE_SEND_TIMEOUT": "5"}, "STILLTHERE_SEND_TIMEOUT"},
			{"bad env integer", nil, map[string]string{"STILLTHERE_PUSH_SECRET": secret, "STILLTHERE_BREAKER_FAILURES": "many"}, "STILLTHERE_BREAKER_FAILURES"},
			{"invalid flag value", []string{"-breaker-failures=0"}, map[string]string{"STILLTHERE_PUSH_SECRET": secret}, "breaker-failures"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				_, err := LoadConfig(tt.args, mapLookup(tt.env))
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("LoadConfig: %v; want an error naming %s", err, tt.want)
				}
			})
		}
	})
}

func TestOpenFails(t *testing.T) {
	t.Run("invalid config", func(t *testing.T) {
		c := validConfig()
		c.PushSecret = "short"
		if _, err := Open(context.Background(), c, testLogger()); err == nil || !strings.Contains(err.Error(), "push-secret") {
			t.Fatalf("Open: %v; want an error naming push-secret", err)
		}
	})
	t.Run("admin address taken", func(t *testing.T) {
		e := newEnv(t)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c := e.cfg
		c.AdminAddr = ln.Addr().String()
		if _, err := Open(context.Background(), c, testLogger()); err == nil || !strings.Contains(err.Error(), "consumer-admin-addr") {
			t.Fatalf("Open: %v; want an error naming consumer-admin-addr", err)
		}
	})
}
