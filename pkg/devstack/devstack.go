// Package devstack runs the whole pipeline in one process for development
// and end-to-end tests: a redis-server child (unless STILLTHERE_REDIS_ADDRS
// names one), an embedded Kafka broker (franz-go's kfake, persisted under
// the data dir, unless STILLTHERE_KAFKA_BROKERS names a real one), and the
// gateway, expiry listener and guide consumer, with the demo chat page and
// its demo bot (bot.go) on the gateway's public listener. Every
// STILLTHERE_* setting is honored; the stack fills in only what is unset.
package devstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"golang.org/x/sync/errgroup"

	"github.com/stillthere/stillthere/pkg/activity"
	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/expiry"
	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/token"
)

// Options configure a dev stack.
type Options struct {
	// Env supplies the STILLTHERE_* settings; nil reads none.
	Env config.Lookup
	// DataDir holds the embedded Kafka's log and the redis-server's files.
	DataDir string
	// KafkaPort is the embedded broker's port on 127.0.0.1; 0 picks one.
	KafkaPort int
	// Logger receives the services' logs.
	Logger *slog.Logger
}

// Stack is a started dev stack: Start, then Run, then Close.
type Stack struct {
	RedisAddr    string
	KafkaBrokers string
	Gateway      *gateway.Gateway
	Listener     *expiry.Listener
	Consumer     *guide.Consumer
	// TokenSecret signs client tokens; DevToken is one for user dev-user.
	TokenSecret string
	DevToken    string
	// Settings are the effective STILLTHERE_* values the stack filled in.
	Settings map[string]string

	GatewayConfig  gateway.Config
	ListenerConfig expiry.Config
	ConsumerConfig guide.Config

	// bot answers the demo page's messages; nil without the page.
	bot   *bot
	redis *redisserver.Server
	kafka *kfake.Cluster
	log   *slog.Logger
}

// Start brings up Redis and Kafka as needed and opens the three services.
func Start(ctx context.Context, opts Options) (s *Stack, err error) {
	if opts.Env == nil {
		opts.Env = func(string) (string, bool) { return "", false }
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s = &Stack{log: opts.Logger, Settings: map[string]string{}}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	env := func(name string) (string, bool) {
		if v, ok := s.Settings[name]; ok {
			return v, true
		}
		return opts.Env(name)
	}
	set := func(flagName, value string) {
		if v, ok := opts.Env(config.EnvName(flagName)); !ok || v == "" {
			s.Settings[config.EnvName(flagName)] = value
		}
	}
	get := func(flagName string) string { v, _ := env(config.EnvName(flagName)); return v }

	if get("redis-addrs") == "" {
		s.redis, err = redisserver.Start(ctx, redisserver.Options{Dir: filepath.Join(opts.DataDir, "redis")})
		if err != nil {
			return nil, err
		}
		set("redis-addrs", s.redis.Addr)
	}
	s.RedisAddr = get("redis-addrs")

	if get("kafka-brokers") == "" {
		kopts := []kfake.Opt{
			kfake.DataDir(filepath.Join(opts.DataDir, "kafka")),
		}
		if opts.KafkaPort != 0 {
			kopts = append(kopts, kfake.Ports(opts.KafkaPort))
		}
		if s.kafka, err = kafkatest.NewFake(kopts...); err != nil {
			return nil, fmt.Errorf("embedded kafka: %w", err)
		}
		set("kafka-brokers", s.kafka.ListenAddrs()[0])
	}
	s.KafkaBrokers = get("kafka-brokers")

	// The activity endpoint is on: the demo bot passes turns through it,
	// as a platform's servers would. So is the timeline endpoint, for
	// seeing why a user was asked (or not).
	for _, name := range []string{"token-secret", "push-secret", "activity-secret", "ops-secret"} {
		set(name, randomSecret())
	}
	// The demo chat page, on the gateway's public listener: a dev stack
	// is for trying stillthere. Production gateways serve no page.
	set("demo-page", "true")
	set("dev-bot-think", DefaultBotThink.String())
	s.TokenSecret = get("token-secret")

	if s.GatewayConfig, err = gateway.LoadConfig(nil, env); err != nil {
		return nil, err
	}
	if s.GatewayConfig.DemoPage && s.GatewayConfig.ActivitySecret != "" {
		if s.bot, err = s.newBot(get("dev-bot-think")); err != nil {
			return nil, err
		}
		s.GatewayConfig.DemoBot = s.bot
	}
	if s.Gateway, err = gateway.Open(ctx, s.GatewayConfig, s.log.With("service", "gateway")); err != nil {
		return nil, err
	}
	if s.bot != nil {
		// Before the gateway serves: Run starts that.
		s.bot.activityURL = "http://" + s.Gateway.PushAddr().String() + activity.Path
	}
	// The consumer pushes to this gateway unless told otherwise, which
	// matters when the gateway's port was picked at random.
	set("push-url", "http://"+s.Gateway.PushAddr().String()+"/v1/push")

	set("spool-dir", filepath.Join(opts.DataDir, "spool"))
	// The listener's outage grace follows the stack's TTL, by the rule
	// behind its production default: a TTL and its jitter for every client
	// to ping again, and a sixth of the TTL (at least 1s) to reconnect.
	ttl := s.GatewayConfig.SessionTTL
	set("outage-grace", (ttl + s.GatewayConfig.SessionJitter + max(time.Second, ttl/6)).String())
	// The listener creates the topic, so it opens before the consumer.
	if s.ListenerConfig, err = expiry.LoadConfig(nil, env); err != nil {
		return nil, err
	}
	if s.Listener, err = expiry.Open(ctx, s.ListenerConfig, s.log.With("service", "expiry-listener")); err != nil {
		return nil, err
	}
	if s.ConsumerConfig, err = guide.LoadConfig(nil, env); err != nil {
		return nil, err
	}
	if s.Consumer, err = guide.Open(ctx, s.ConsumerConfig, s.log.With("service", "guide-consumer")); err != nil {
		return nil, err
	}
	if s.DevToken, err = token.Mint([]byte(s.TokenSecret), "dev-user", "", 24*time.Hour); err != nil {
		return nil, err
	}
	return s, nil
}

// Run runs the three services until ctx is done, Close is called or one
// fails. It returns after all three have stopped; Close frees them.
func (s *Stack) Run(ctx context.Context) error {
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return wrap("gateway", s.Gateway.Run(ctx)) })
	eg.Go(func() error { return wrap("expiry listener", s.Listener.Run(ctx)) })
	eg.Go(func() error { return wrap("guide consumer", s.Consumer.Run(ctx)) })
	if s.bot != nil {
		// A bot still thinking would hold up the gateway's shutdown.
		eg.Go(func() error { <-ctx.Done(); s.bot.Stop(); return nil })
	}
	err := eg.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func wrap(name string, err error) error {
	if err == nil {
		// A service stopping cleanly stops its siblings too.
		return context.Canceled
	}
	return fmt.Errorf("%s: %w", name, err)
}

// Close stops the services if they run and frees them, the consumer
// first and the gateway last (the reverse of Start), then stops Kafka and
// Redis, if the stack started them. It also frees what a failed Start
// opened.
func (s *Stack) Close() error {
	var errs []error
	if s.bot != nil {
		s.bot.Stop()
	}
	if s.Consumer != nil {
		errs = append(errs, s.Consumer.Close())
	}
	if s.Listener != nil {
		errs = append(errs, s.Listener.Close())
	}
	if s.Gateway != nil {
		errs = append(errs, s.Gateway.Close())
	}
	if s.kafka != nil {
		s.kafka.Close()
		s.kafka = nil
	}
	if s.redis != nil {
		s.redis.Close()
		s.redis = nil
	}
	return errors.Join(errs...)
}

// KillRedis stops the child redis-server abruptly, for fault tests.
func (s *Stack) KillRedis() { s.redis.Kill() }

// Banner describes where everything listens.
func (s *Stack) Banner(w io.Writer) {
	g, l, c := s.GatewayConfig, s.ListenerConfig, s.ConsumerConfig
	redisNote, kafkaNote := "", ""
	if s.redis != nil {
		redisNote = " (child redis-server)"
	}
	if s.kafka != nil {
		kafkaNote = " (embedded, kfake)"
	}
	fmt.Fprintf(w, `
stillthere dev stack is up
  redis     %s%s
  kafka     %s%s, topic %q (%d partitions)
  gateway   ws://%s/v1/ws   push, health, metrics: http://%s
  listener  http://%s/metrics   mode %s, sweep every %v
  consumer  http://%s/metrics   group %q
  sessions  TTL %v + jitter [0, %v)

dev token for user "dev-user", valid 24h:
  %s

try it:
  go run ./dev/client -url ws://%s/v1/ws -token %s

why was a user asked (or not)? their timeline:
  curl -H "Authorization: Bearer %s" http://%s/v1/users/dev-user/timeline
%s`,
		s.RedisAddr, redisNote,
		s.KafkaBrokers, kafkaNote, l.Kafka.Topic, l.Kafka.Partitions,
		s.Gateway.PublicAddr(), s.Gateway.PushAddr(),
		s.Listener.AdminAddr(), l.Mode, l.SweepInterval,
		s.Consumer.AdminAddr(), c.Group,
		g.SessionTTL, g.SessionJitter,
		s.DevToken,
		s.Gateway.PublicAddr(), s.DevToken,
		g.OpsSecret, s.Gateway.PushAddr(),
		s.demoLine())
}

// BotThink is how long the demo bot thinks before it answers; 0 when
// the stack runs no bot (no demo page).
func (s *Stack) BotThink() time.Duration {
	if s.bot == nil {
		return 0
	}
	return s.bot.think
}

// DemoURL is the demo page's address with the dev token in its fragment,
// which the browser keeps to itself; empty when the gateway serves no
// page.
func (s *Stack) DemoURL() string {
	if !s.GatewayConfig.DemoPage {
		return ""
	}
	return "http://" + s.Gateway.PublicAddr().String() + "/demo/#token=" + s.DevToken
}

func (s *Stack) demoLine() string {
	u := s.DemoURL()
	if u == "" {
		return ""
	}
	if s.bot == nil {
		return "or open the demo chat in a browser, and stop typing:\n  " + u + "\n"
	}
	return fmt.Sprintf("or open the demo chat in a browser, write to its bot (it thinks %v), and stop typing:\n  %s\n", s.bot.think, u)
}

// newBot builds the demo bot from the gateway's settings: it verifies
// tokens as the gateway does, and thinks for think (a duration).
func (s *Stack) newBot(think string) (*bot, error) {
	d, err := botThink(config.EnvName("dev-bot-think"), think)
	if err != nil {
		return nil, err
	}
	g := s.GatewayConfig
	verifier, err := token.NewVerifier([]byte(g.TokenSecret), token.Rules{
		Issuer:      g.TokenIssuer,
		Audience:    g.TokenAudience,
		MaxLifetime: g.TokenMaxLifetime,
	})
	if err != nil {
		return nil, err
	}
	return newBot(verifier, g.ActivitySecret, d, s.log.With("service", "demo-bot")), nil
}

func randomSecret() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// KafkaPortFromEnv reads STILLTHERE_DEV_KAFKA_PORT, default 9092.
func KafkaPortFromEnv(env config.Lookup) (int, error) {
	v, ok := env(config.EnvName("dev-kafka-port"))
	if !ok || v == "" {
		return 9092, nil
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < 0 || p > 65535 {
		return 0, fmt.Errorf("%s=%q: not a port", config.EnvName("dev-kafka-port"), v)
	}
	return p, nil
}

// DataDirFromEnv reads STILLTHERE_DEV_DATA_DIR, default .stillthere.
func DataDirFromEnv(env config.Lookup) string {
	if v, ok := env(config.EnvName("dev-data-dir")); ok && v != "" {
		return v
	}
	return ".stillthere"
}
