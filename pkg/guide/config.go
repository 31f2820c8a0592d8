package guide

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/redisconn"
)

// Config is the guide consumer's configuration.
type Config struct {
	Redis redisconn.Config
	Kafka kafka.Config

	// AdminAddr serves /healthz, /readyz and /metrics. Default 127.0.0.1:8083.
	AdminAddr string
	// Group is the Kafka consumer group. Default "stillthere-guide".
	Group string
	// PushURL is the gateway's push endpoint. Default
	// http://127.0.0.1:8081/v1/push.
	PushURL string
	// PushSecret is the push endpoint's bearer secret. Required.
	PushSecret string
	// GuideText is the message sent. Default "Are you still there?".
	GuideText string
	// SendTimeout bounds one push; a slow downstream counts as failing.
	// Default 5s.
	SendTimeout time.Duration
	// BreakerFailures is how many failures in a row open the breaker.
	// Default 5.
	BreakerFailures int
	// BreakerTimeout is how long the breaker stays open before a probe.
	// Default 10s.
	BreakerTimeout time.Duration
}

// Bind registers the consumer's settings on b.
func (c *Config) Bind(b *config.Binder) {
	c.Redis.Bind(b)
	c.Kafka.Bind(b)
	b.String(&c.AdminAddr, "consumer-admin-addr", "127.0.0.1:8083", "listen address of health and metrics")
	b.String(&c.Group, "consumer-group", "stillthere-guide", "Kafka consumer group")
	b.String(&c.PushURL, "push-url", "http://127.0.0.1:8081/v1/push", "the gateway's push endpoint")
	b.Secret(&c.PushSecret, "push-secret", "bearer secret of the push endpoint (required)")
	b.String(&c.GuideText, "guide-text", "Are you still there?", "text of the guide message")
	b.Duration(&c.SendTimeout, "send-timeout", 5*time.Second, "timeout of one push")
	b.Int(&c.BreakerFailures, "breaker-failures", 5, "consecutive failures that open the circuit breaker")
	b.Duration(&c.BreakerTimeout, "breaker-timeout", 10*time.Second, "how long the breaker stays open before probing")
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
	if u, err := url.Parse(c.PushURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("push-url: %q is not an http(s) URL", c.PushURL)
	}
	switch {
	case c.AdminAddr == "":
		return errors.New("consumer-admin-addr: empty")
	case c.Group == "":
		return errors.New("consumer-group: empty")
	case len(c.PushSecret) < 32:
		return fmt.Errorf("push-secret: %d bytes, want at least 32", len(c.PushSecret))
	case c.GuideText == "" || len(c.GuideText) > 1024:
		return fmt.Errorf("guide-text: %d bytes, want 1-1024", len(c.GuideText))
	case c.SendTimeout < 10*time.Millisecond:
		return fmt.Errorf("send-timeout: %v, want at least 10ms", c.SendTimeout)
	case c.BreakerFailures < 1:
		return fmt.Errorf("breaker-failures: %d, want at least 1", c.BreakerFailures)
	case c.BreakerTimeout < 100*time.Millisecond:
		return fmt.Errorf("breaker-timeout: %v, want at least 100ms", c.BreakerTimeout)
	}
	return nil
}
