package guide

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/userid"
)

// Senders, the values of Config.Sender.
const (
	SenderGateway = "gateway" // the gateway's push endpoint
	SenderWebhook = "webhook" // a platform's own endpoint, signed JSON
)

// maxGuideText bounds a guide's text, as the gateway's push endpoint does.
const maxGuideText = 1024

// Config is the guide consumer's configuration.
type Config struct {
	Redis redisconn.Config
	Kafka kafka.Config
	// Timeline bounds the users' decision timelines, and turns this
	// consumer's recording in them off (Off). Default on, 100 entries,
	// 24h, as the gateway's.
	Timeline timeline.Settings

	// AdminAddr serves /healthz, /readyz and /metrics. Default 127.0.0.1:8083.
	AdminAddr string
	// Pprof serves /debug/pprof/ on the admin listener. Default false:
	// profiles are unauthenticated and cost CPU while they run.
	Pprof bool
	// Group is the Kafka consumer group. Default "stillthere-guide".
	Group string
	// GroupSessionTimeout is how long a replica that stopped heartbeating
	// (it crashed) keeps its partitions before the group moves them.
	// Default 45s, Kafka's; the broker bounds it (6s-30m by default).
	GroupSessionTimeout time.Duration
	// DLQTopic receives records that cannot be settled otherwise: poison
	// records and guides the downstream refused for good. Created at
	// start like the timeout topic. Default "session-timeouts-dlq".
	DLQTopic string
	// Sender picks the downstream: SenderGateway (default) or
	// SenderWebhook.
	Sender string
	// PushURL is the gateway's push endpoint. Default
	// http://127.0.0.1:8081/v1/push.
	PushURL string
	// PushSecret is the push endpoint's bearer secret. Required with the
	// gateway sender.
	PushSecret string
	// WebhookURL receives guides with the webhook sender. Required then.
	WebhookURL string
	// WebhookSecret signs webhook bodies (HMAC-SHA256). Required, at least
	// 32 bytes, with the webhook sender.
	WebhookSecret string
	// NotifyURL receives notify stages (timeoutevent.ActionNotify), the
	// platform's "this user went away", whichever sender guides go
	// through. Default: WebhookURL with the webhook sender, else none,
	// and a notify stage is dead-lettered, naming this setting.
	NotifyURL string
	// NotifySecret signs notify bodies as WebhookSecret does the guides'.
	// Required with NotifyURL, at least 32 bytes; default WebhookSecret
	// with the webhook sender.
	NotifySecret string
	// GuideText is the message sent to a segment without a template.
	// Default "Are you still there?".
	GuideText string
	// GuideTemplates is the text per segment: "seg=text,seg=text", or
	// "@file" naming a JSON object of segment to text (for texts with
	// commas). Default none: everyone gets GuideText.
	GuideTemplates string
	// GuideMaxAge drops events confirmed longer ago than this, by Redis's
	// clock: a guide that late only confuses. An event is confirmed at its
	// detection: just past its deadline, or when the listener's outage
	// hold ended. Default 5m.
	GuideMaxAge time.Duration
	// MaxInFlight bounds the records taken from Kafka and not yet settled
	// (being sent, or waiting to be retried); at the bound fetching
	// pauses. Default 256.
	MaxInFlight int
	// SendTimeout bounds one send (and one session check); a slow
	// downstream counts as failing. Default 5s.
	SendTimeout time.Duration
	// BreakerFailures is how many failures in a row open a breaker.
	// Default 5.
	BreakerFailures int
	// BreakerTimeout is how long a breaker stays open before a probe.
	// Default 10s.
	BreakerTimeout time.Duration
}

// DefaultConfig is the consumer's configuration by default, without the
// push secret, which has none: what LoadConfig reads from no flags and no
// environment.
func DefaultConfig() Config {
	return Config{
		Redis:               redisconn.DefaultConfig(),
		Kafka:               kafka.DefaultConfig(),
		Timeline:            timeline.Settings{Bounds: session.TimelineBounds{Entries: timeline.DefaultEntries, Keep: timeline.DefaultKeep}},
		AdminAddr:           "127.0.0.1:8083",
		Group:               "stillthere-guide",
		GroupSessionTimeout: 45 * time.Second,
		DLQTopic:            "session-timeouts-dlq",
		Sender:              SenderGateway,
		PushURL:             "http://" + push.DefaultAddr + push.Path,
		GuideText:           "Are you still there?",
		GuideMaxAge:         push.DefaultGuideMaxAge,
		MaxInFlight:         256,
		SendTimeout:         5 * time.Second,
		BreakerFailures:     5,
		BreakerTimeout:      10 * time.Second,
	}
}

// Bind registers the consumer's settings on b, with DefaultConfig's
// values as their defaults.
func (c *Config) Bind(b *config.Binder) {
	d := DefaultConfig()
	c.Redis.Bind(b)
	c.Kafka.Bind(b)
	c.Timeline.Bind(b)
	b.String(&c.AdminAddr, "consumer-admin-addr", d.AdminAddr, "listen address of health and metrics")
	b.Bool(&c.Pprof, "pprof", d.Pprof, "serve /debug/pprof/ on the admin listener (unauthenticated)")
	b.String(&c.Group, "consumer-group", d.Group, "Kafka consumer group")
	b.Duration(&c.GroupSessionTimeout, "group-session-timeout", d.GroupSessionTimeout, "how long a crashed replica keeps its partitions")
	b.String(&c.DLQTopic, "dlq-topic", d.DLQTopic, "dead-letter topic for poison records and refused guides")
	b.String(&c.Sender, "sender", d.Sender, "downstream: gateway (push endpoint) or webhook")
	b.String(&c.PushURL, "push-url", d.PushURL, "the gateway's push endpoint")
	b.Secret(&c.PushSecret, "push-secret", "bearer secret of the push endpoint (required with sender=gateway)")
	b.String(&c.WebhookURL, "webhook-url", d.WebhookURL, "URL the webhook sender POSTs guides to (required with sender=webhook)")
	b.Secret(&c.WebhookSecret, "webhook-secret", "HMAC-SHA256 key of the webhook signature (required with sender=webhook)")
	b.String(&c.NotifyURL, "notify-url", d.NotifyURL, "URL notify stages are POSTed to, signed (default: webhook-url with sender=webhook)")
	b.Secret(&c.NotifySecret, "notify-secret", "HMAC-SHA256 key of the notify webhook's signature (default: webhook-secret with sender=webhook)")
	b.String(&c.GuideText, "guide-text", d.GuideText, "text of the guide message, for segments without a template")
	b.String(&c.GuideTemplates, "guide-templates", d.GuideTemplates, `guide text per segment: "new=Still with us?,vip=..." or "@file" with a JSON object`)
	b.Duration(&c.GuideMaxAge, "guide-max-age", d.GuideMaxAge, "drop events confirmed (detected) longer ago than this")
	b.Int(&c.MaxInFlight, "max-in-flight", d.MaxInFlight, "records taken and not yet settled before fetching pauses")
	b.Duration(&c.SendTimeout, "send-timeout", d.SendTimeout, "timeout of one send")
	b.Int(&c.BreakerFailures, "breaker-failures", d.BreakerFailures, "consecutive failures that open a circuit breaker")
	b.Duration(&c.BreakerTimeout, "breaker-timeout", d.BreakerTimeout, "how long a breaker stays open before probing")
}

// LoadConfig reads the consumer's settings from args and env.
func LoadConfig(args []string, env config.Lookup) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("guide-consumer", flag.ContinueOnError)
	b := config.NewBinder(fs, env)
	c.Bind(b)
	if err := b.Parse(args); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if err := c.Redis.Validate(); err != nil {
		return err
	}
	if err := c.Kafka.Validate(); err != nil {
		return err
	}
	if err := c.Timeline.Validate(); err != nil {
		return err
	}
	switch c.Sender {
	case SenderGateway:
		if err := checkURL(c.PushURL); err != nil {
			return fmt.Errorf("push-url: %w", err)
		}
		if len(c.PushSecret) < 32 {
			return fmt.Errorf("push-secret: %d bytes, want at least 32", len(c.PushSecret))
		}
	case SenderWebhook:
		if err := checkURL(c.WebhookURL); err != nil {
			return fmt.Errorf("webhook-url: %w", err)
		}
		if len(c.WebhookSecret) < 32 {
			return fmt.Errorf("webhook-secret: %d bytes, want at least 32", len(c.WebhookSecret))
		}
	default:
		return fmt.Errorf("sender: %q, want %s or %s", c.Sender, SenderGateway, SenderWebhook)
	}
	switch url, secret := c.notifyTarget(); {
	case c.NotifyURL == "" && c.NotifySecret != "":
		// With the webhook sender notify stages go to webhook-url, signed
		// with webhook-secret: this one would sign nothing.
		return errors.New("notify-secret: set without notify-url, so nothing would be signed with it")
	case url == "":
	case checkURL(url) != nil:
		return fmt.Errorf("notify-url: %w", checkURL(url))
	case len(secret) < 32:
		return fmt.Errorf("notify-secret: %d bytes, want at least 32 (required with notify-url)", len(secret))
	case c.PushSecret != "" && secret == c.PushSecret:
		return errors.New("notify-secret: the same as push-secret; the platform's notify receiver holds it, and with it could push guides")
	}
	if _, err := c.templates(); err != nil {
		return err
	}
	switch {
	case c.AdminAddr == "":
		return errors.New("consumer-admin-addr: empty")
	case c.Group == "":
		return errors.New("consumer-group: empty")
	case c.GroupSessionTimeout < time.Second:
		return fmt.Errorf("group-session-timeout: %v, want at least 1s", c.GroupSessionTimeout)
	case c.DLQTopic == "" || c.DLQTopic == c.Kafka.Topic:
		return fmt.Errorf("dlq-topic: %q, want a topic other than %q", c.DLQTopic, c.Kafka.Topic)
	case c.GuideText == "" || len(c.GuideText) > maxGuideText:
		return fmt.Errorf("guide-text: %d bytes, want 1-%d", len(c.GuideText), maxGuideText)
	case c.GuideMaxAge < time.Second:
		return fmt.Errorf("guide-max-age: %v, want at least 1s", c.GuideMaxAge)
	case c.MaxInFlight < 1 || c.MaxInFlight > 100_000:
		return fmt.Errorf("max-in-flight: %d, want 1-100000", c.MaxInFlight)
	case c.SendTimeout < 10*time.Millisecond:
		return fmt.Errorf("send-timeout: %v, want at least 10ms", c.SendTimeout)
	case c.BreakerFailures < 1:
		return fmt.Errorf("breaker-failures: %d, want at least 1", c.BreakerFailures)
	case c.BreakerTimeout < 100*time.Millisecond:
		return fmt.Errorf("breaker-timeout: %v, want at least 100ms", c.BreakerTimeout)
	}
	return nil
}

func checkURL(s string) error {
	if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", s)
	}
	return nil
}

// templates reads GuideTemplates; errors name the setting.
func (c Config) templates() (map[string]string, error) {
	spec := c.GuideTemplates
	if path, ok := strings.CutPrefix(spec, "@"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("guide-templates: %w", err)
		}
		var m map[string]string
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("guide-templates: %s: want a JSON object of segment to text: %w", path, err)
		}
		if err := checkTemplates(m); err != nil {
			return nil, fmt.Errorf("guide-templates: %s: %w", path, err)
		}
		return m, nil
	}
	m, err := parseTemplates(spec)
	if err != nil {
		return nil, fmt.Errorf("guide-templates: %w", err)
	}
	return m, nil
}

// parseTemplates reads "seg=text,seg=text". Texts cannot hold a comma in
// this form; the JSON file form has no such limit.
func parseTemplates(spec string) (map[string]string, error) {
	m := make(map[string]string)
	for _, item := range strings.Split(spec, ",") {
		if strings.TrimSpace(item) == "" {
			continue
		}
		seg, text, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want segment=text", item)
		}
		seg, text = strings.TrimSpace(seg), strings.TrimSpace(text)
		if _, dup := m[seg]; dup {
			return nil, fmt.Errorf("segment %q given twice", seg)
		}
		m[seg] = text
	}
	return m, checkTemplates(m)
}

func checkTemplates(m map[string]string) error {
	for seg, text := range m {
		if !userid.ValidSegment(seg) {
			return fmt.Errorf("segment %q: want 1-64 characters of [A-Za-z0-9._-]", seg)
		}
		if text == "" || len(text) > maxGuideText {
			return fmt.Errorf("segment %q: text of %d bytes, want 1-%d", seg, len(text), maxGuideText)
		}
	}
	return nil
}

// notifyTarget is where notify stages go and the key they are signed
// with: NotifyURL, else the guide webhook's with the webhook sender; ""
// when nowhere.
func (c Config) notifyTarget() (url, secret string) {
	webhook := c.Sender == SenderWebhook
	switch {
	case c.NotifyURL != "" && webhook:
		return c.NotifyURL, cmp.Or(c.NotifySecret, c.WebhookSecret)
	case c.NotifyURL != "":
		return c.NotifyURL, c.NotifySecret
	case webhook:
		return c.WebhookURL, c.WebhookSecret
	}
	return "", ""
}

// GCPercent is the consumer's garbage collector goal, unless the GOGC
// environment variable says otherwise: the heap may grow by twice the
// live heap between collections, where Go's default lets it double. The
// consumer's live heap is small (the records in hand) and each guide
// leaves its request, its reply and its event behind, so collections
// would come often for little memory; on two cores, a storm's release
// spent about a tenth of its CPU in the collector at the default
// (bench/report.md, step 4). The memory limit TuneGC sets from the
// container's keeps the larger heap inside it.
const GCPercent = 200
