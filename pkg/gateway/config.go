package gateway

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/activity"
	"github.com/stillthere/stillthere/pkg/activityfeed"
	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/token"
	"github.com/stillthere/stillthere/pkg/wsread"
)

// Config is the gateway's configuration. Each field's default is in
// DefaultConfig; Validate names the first bad field.
type Config struct {
	Redis redisconn.Config

	// Addr is the public WebSocket listener. Default 127.0.0.1:8080.
	Addr string
	// PushAddr is the internal listener: the push endpoint the guide
	// consumer calls, health and metrics. Default 127.0.0.1:8081. Keep it
	// off the public network.
	PushAddr string
	// Pprof serves /debug/pprof/ on the internal listener. Default false:
	// profiles are unauthenticated and cost CPU while they run.
	Pprof bool
	// TokenSecret signs client JWTs (HS256), at least 32 bytes. Required.
	TokenSecret string
	// PushSecret is the bearer token the push endpoint requires, at least
	// 32 bytes. Required.
	PushSecret string
	// ActivitySecret is the bearer token of the activity endpoint, POST
	// /v1/activity, through which a chat platform's servers report their
	// users' activity and turns. Default empty: the endpoint is off (404).
	// When set, at least 32 bytes, and not the push secret.
	ActivitySecret string
	// OpsSecret is the bearer token of the timeline endpoint, GET
	// /v1/users/{uid}/timeline, through which a platform's support team
	// reads what stillthere decided about a user. Default empty: the
	// endpoint is off (404). When set, at least 32 bytes, and none of the
	// other secrets.
	OpsSecret string
	// Timeline bounds the users' decision timelines, and turns this
	// gateway's recording off.
	Timeline timeline.Settings
	// ActivityFeed is the activity topic's consumer, the Kafka way of the
	// same activity (docs/protocol.md). Off by default.
	ActivityFeed activityfeed.Config
	// TokenIssuer and TokenAudience, when set, must be the client tokens'
	// "iss" and among their "aud". Default empty: not checked.
	TokenIssuer   string
	TokenAudience string
	// TokenMaxLifetime refuses tokens that live longer than this, from
	// their "iat" (or from now) to their "exp". 0 means no limit. Default
	// 24h. A connection is closed with 4001 when its token expires,
	// unless the client sent a fresh one in an auth frame.
	TokenMaxLifetime time.Duration
	// AllowedOrigins lists the browser Origins allowed to connect. Empty
	// allows only an Origin whose host is the request's Host.
	AllowedOrigins []string
	// DemoPage serves the demo chat page (package web) at /demo/ on the
	// public listener. Default false: it is for trying stillthere, not
	// for users; the dev stack turns it on.
	DemoPage bool
	// DemoBot, with DemoPage on, answers the page's messages at POST
	// /demo/bot on the public listener. Not a setting: only the dev stack
	// sets one (its demo bot), so no gateway built from flags serves a
	// bot. Default nil: none.
	DemoBot http.Handler

	// SessionTTL is granted on each ping, plus a uniform jitter in
	// [0, SessionJitter) so expiries don't clump. Defaults 60s and 5s.
	// A timeout policy stored in Redis (see "gateway policy") overrides
	// both, per segment.
	SessionTTL    time.Duration
	SessionJitter time.Duration
	// Closing shapes the default segment's stages while no timeout
	// policy is stored: a reminder at the deadline, then a close stage
	// (close-after, default 3m; 0: none) with close-text. The expiry
	// listener reads the same settings; give both the same values.
	Closing policy.Closing
	// PolicyRefresh is how often the stored timeout policy is re-read.
	// Default 2s.
	PolicyRefresh time.Duration

	// ReadLimit is the largest client frame, in bytes; larger ones close
	// the connection with 1009. Default 4096; at least 3200, room for an
	// auth frame with the longest token.
	ReadLimit int
	// RateBurst and RatePerSecond limit each connection's frames; beyond
	// them it is closed with 1008. Defaults 20 and 5.
	RateBurst     int
	RatePerSecond float64
	// ReadMode is how client connections are read: "epoll" (Linux; the
	// default there) waits for input on one epoll set for all of them,
	// with no goroutine parked per idle connection; "goroutine" (the
	// default elsewhere) gives each connection a reader goroutine.
	// Both speak the same protocol through gorilla/websocket.
	ReadMode string
	// IdleTimeout closes a connection that sent nothing, not even a
	// protocol pong, for this long. The gateway sends protocol pings at
	// 9/10 of it. Default 60s.
	IdleTimeout time.Duration
	// WriteTimeout bounds each write to a client. Default 10s.
	WriteTimeout time.Duration
	// HandshakeTimeout bounds the WebSocket upgrade: reading its request,
	// and the whole of a connection that never upgrades. Default 10s.
	HandshakeTimeout time.Duration
	// PushIdleTimeout closes a keep-alive connection to the internal
	// listener idle this long. Keep it above the consumer's idle
	// connection timeout (90s), so that the consumer closes first.
	// Default (and zero) 120s.
	PushIdleTimeout time.Duration
	// SendQueue is the number of frames queued per connection; a client
	// that lets it fill is cut off. Default 32.
	SendQueue int
	// ShutdownTimeout bounds the drain on SIGTERM. Default 10s.
	ShutdownTimeout time.Duration

	// InstanceID names this gateway for routing guides between instances:
	// 1-128 characters of [A-Za-z0-9._:@-] (validInstanceID). Default:
	// the host name plus a random suffix, new on every start.
	InstanceID string
	// InboxSize and InboxTTL bound the guides kept for a user with no
	// connection until their next connect. Defaults 10 and 24h. Each
	// guide is kept until GuideMaxAge after its deadline at most.
	InboxSize int
	InboxTTL  time.Duration
	// GuideMaxAge is how long after its deadline a guide kept in an inbox
	// may still be handed over: the guide consumer's guide-max-age, and
	// the same setting (STILLTHERE_GUIDE_MAX_AGE). Zero means the
	// consumer's default, 5m.
	GuideMaxAge time.Duration

	// MaxConns caps this instance's connections; beyond it an upgrade
	// gets HTTP 503, so a load balancer tries another instance. Zero
	// means the open-file limit less 1024 descriptors of headroom.
	MaxConns int
	// MaxUserConns caps one user's connections on this instance, those
	// being set up included; beyond it an upgrade gets HTTP 429, so that
	// one token cannot take the connections of an instance from everyone
	// else. Per instance: a user may hold it on each. Default (and zero)
	// 10: phones, tablets, laptops and a few tabs, with room for
	// connections whose network went and that the gateway has not yet
	// found dead (up to the idle timeout).
	MaxUserConns int

	// RenewGranularity is the least time between two renewals of one
	// user's session in one segment, across the user's connections on
	// this instance; pings in between are answered from the last grant
	// (see user.go), so the user costs Redis one renewal per granularity
	// however many devices ping. Default 1s. At most half the session TTL, and the gateway applies no
	// stored policy with a shorter TTL than twice it: a client pinging just
	// faster than the granularity is renewed only at its second ping, up
	// to twice the granularity after the last renewal.
	RenewGranularity time.Duration
	// RenewFlushInterval and RenewBatch set how renewals from all
	// connections share Redis round trips: a flush every interval or
	// batch renewals, whichever comes first. Defaults 2ms and 256.
	RenewFlushInterval time.Duration
	RenewBatch         int

	// HeartbeatInterval is how often this instance tells Redis it is
	// alive, for a lease of three intervals: the expiry listener does not
	// count time in which an instance's users could not reach it toward
	// their silence. Default 1s.
	HeartbeatInterval time.Duration
	// ShedAfter is how long Redis may be out of this instance's reach
	// before it closes its clients' connections (close 1013, try again
	// later), once per outage, so that they reconnect to an instance that
	// can renew their sessions. The listener holds a dead or cut-off
	// instance's users only for its outage grace after the instance's last
	// heartbeat, so ShedAfter plus the clients' reconnect time must stay
	// under that grace. 0 never sheds. Default 15s.
	ShedAfter time.Duration

	// routeRefreshEvery and routeKeyTTL override defaultRouteRefresh and
	// defaultRouteTTL, for tests; zero means the default.
	routeRefreshEvery, routeKeyTTL time.Duration
	// firstPingWaitFor overrides defaultFirstPingWait, for tests.
	firstPingWaitFor time.Duration
}

// FallbackPolicy is the timeout policy in force while none is stored.
func (c Config) FallbackPolicy() policy.Policy {
	return policy.Fallback(c.SessionTTL, c.SessionJitter, c.Closing)
}

// guideMaxAge is GuideMaxAge, or its default.
func (c Config) guideMaxAge() time.Duration { return cmp.Or(c.GuideMaxAge, push.DefaultGuideMaxAge) }

func (c Config) pushIdleTimeout() time.Duration {
	return cmp.Or(c.PushIdleTimeout, defaultPushIdleTimeout)
}

// maxUserConns is MaxUserConns, or its default.
func (c Config) maxUserConns() int { return cmp.Or(c.MaxUserConns, defaultMaxUserConns) }

// defaultMaxUserConns is MaxUserConns's default.
const defaultMaxUserConns = 10

// minReadLimit is the least read-limit: an auth frame of the longest
// token, with room for its JSON.
const minReadLimit = frame.MaxTokenLen + 128

// checkReadMode says why mode is not a read mode this build can run.
func checkReadMode(mode string) error {
	m, err := wsread.ParseMode(mode)
	if err != nil {
		return err
	}
	if m == wsread.ModeEpoll && wsread.DefaultMode() != wsread.ModeEpoll {
		return fmt.Errorf("%q needs Linux; use %q", m, wsread.ModeGoroutine)
	}
	return nil
}

// defaultPushIdleTimeout is PushIdleTimeout's default.
const defaultPushIdleTimeout = 120 * time.Second

// pushReadTimeout bounds reading a whole request on the internal
// listener: a push is a few hundred bytes.
const pushReadTimeout = 30 * time.Second

func (c Config) routeRefresh() time.Duration { return cmp.Or(c.routeRefreshEvery, defaultRouteRefresh) }
func (c Config) routeTTL() time.Duration     { return cmp.Or(c.routeKeyTTL, defaultRouteTTL) }

// DefaultConfig is the gateway's configuration by default, without the
// two required secrets, which have none (the activity secret's default is
// empty: no activity endpoint): what LoadConfig reads from no flags and
// no environment. Fields whose zero value means their default are set to
// the default all the same.
func DefaultConfig() Config {
	return Config{
		Redis:              redisconn.DefaultConfig(),
		Timeline:           timeline.Settings{Bounds: session.TimelineBounds{Entries: timeline.DefaultEntries, Keep: timeline.DefaultKeep}},
		Addr:               "127.0.0.1:8080",
		PushAddr:           push.DefaultAddr,
		TokenMaxLifetime:   24 * time.Hour,
		SessionTTL:         policy.DefaultSessionTTL,
		SessionJitter:      policy.DefaultSessionJitter,
		Closing:            policy.DefaultClosing(),
		PolicyRefresh:      policy.DefaultRefresh,
		ReadLimit:          4096,
		RateBurst:          20,
		RatePerSecond:      5,
		ReadMode:           string(wsread.DefaultMode()),
		IdleTimeout:        60 * time.Second,
		WriteTimeout:       10 * time.Second,
		HandshakeTimeout:   10 * time.Second,
		PushIdleTimeout:    defaultPushIdleTimeout,
		SendQueue:          32,
		ShutdownTimeout:    10 * time.Second,
		InboxSize:          10,
		InboxTTL:           24 * time.Hour,
		GuideMaxAge:        push.DefaultGuideMaxAge,
		MaxUserConns:       defaultMaxUserConns,
		RenewGranularity:   policy.DefaultRenewGranularity,
		RenewFlushInterval: 2 * time.Millisecond,
		RenewBatch:         256,
		HeartbeatInterval:  time.Second,
		ShedAfter:          15 * time.Second,
		ActivityFeed:       activityfeed.DefaultConfig(),
	}
}

// Bind registers the gateway's settings on b, with DefaultConfig's
// values as their defaults.
func (c *Config) Bind(b *config.Binder) {
	d := DefaultConfig()
	c.Redis.Bind(b)
	b.String(&c.Addr, "gateway-addr", d.Addr, "public WebSocket listen address")
	b.String(&c.PushAddr, "push-addr", d.PushAddr, "internal listen address: push endpoint, health, metrics")
	b.Bool(&c.Pprof, "pprof", d.Pprof, "serve /debug/pprof/ on the internal listener (unauthenticated)")
	b.Secret(&c.TokenSecret, "token-secret", "HS256 secret of client tokens, at least 32 bytes (required)")
	b.Secret(&c.PushSecret, "push-secret", "bearer secret of the push endpoint, at least 32 bytes (required)")
	b.Secret(&c.ActivitySecret, "activity-secret", "bearer secret of the activity endpoint, at least 32 bytes and not the push secret; empty: no activity endpoint")
	b.Secret(&c.OpsSecret, "ops-secret", "bearer secret of the timeline endpoint, at least 32 bytes and none of the other secrets; empty: no timeline endpoint")
	c.Timeline.Bind(b)
	c.ActivityFeed.Bind(b)
	b.String(&c.TokenIssuer, "token-issuer", d.TokenIssuer, "required iss of client tokens; empty: not checked")
	b.String(&c.TokenAudience, "token-audience", d.TokenAudience, "required aud of client tokens; empty: not checked")
	b.Duration(&c.TokenMaxLifetime, "token-max-lifetime", d.TokenMaxLifetime, "longest lifetime (exp less iat) of a client token; 0: no limit")
	b.List(&c.AllowedOrigins, "allowed-origins", strings.Join(d.AllowedOrigins, ","), "browser Origins allowed to connect, comma-separated; empty allows same host only")
	b.Bool(&c.DemoPage, "demo-page", d.DemoPage, "serve the demo chat page at /demo/ on the public listener (for trying stillthere, not for users)")
	b.Duration(&c.SessionTTL, "session-ttl", d.SessionTTL, "session TTL granted on each ping")
	b.Duration(&c.SessionJitter, "session-jitter", d.SessionJitter, "random extra TTL in [0, jitter)")
	c.Closing.Bind(b)
	b.Duration(&c.PolicyRefresh, "policy-refresh", d.PolicyRefresh, "how often the timeout policy in Redis is re-read")
	b.Int(&c.ReadLimit, "read-limit", d.ReadLimit, "largest client frame in bytes")
	b.Int(&c.RateBurst, "rate-burst", d.RateBurst, "frames a connection may send in a burst")
	b.Float(&c.RatePerSecond, "rate-per-second", d.RatePerSecond, "sustained frames per second per connection")
	b.String(&c.ReadMode, "read-mode", d.ReadMode, "how client connections are read: epoll (Linux), or a goroutine per connection")
	b.Duration(&c.IdleTimeout, "idle-timeout", d.IdleTimeout, "close a connection silent at the protocol level this long")
	b.Duration(&c.WriteTimeout, "write-timeout", d.WriteTimeout, "timeout of each write to a client")
	b.Duration(&c.HandshakeTimeout, "handshake-timeout", d.HandshakeTimeout, "timeout of the WebSocket upgrade")
	b.Duration(&c.PushIdleTimeout, "push-idle-timeout", d.PushIdleTimeout, "close a keep-alive connection to the internal listener idle this long")
	b.Int(&c.SendQueue, "send-queue", d.SendQueue, "frames queued per connection before it is cut off as slow")
	b.Duration(&c.ShutdownTimeout, "shutdown-timeout", d.ShutdownTimeout, "drain deadline on SIGTERM")
	b.String(&c.InstanceID, "instance-id", d.InstanceID, "this gateway's name for routing guides; default host name plus a random suffix")
	b.Int(&c.InboxSize, "inbox-size", d.InboxSize, "guides kept per offline user")
	b.Duration(&c.InboxTTL, "inbox-ttl", d.InboxTTL, "how long guides are kept for an offline user, at most")
	b.Duration(&c.GuideMaxAge, "guide-max-age", d.GuideMaxAge, "how long after its deadline a kept guide may still be handed over (the consumer's setting)")
	b.Int(&c.MaxConns, "max-conns", d.MaxConns, "most connections on this instance, beyond it HTTP 503; 0 means the open-file limit less 1024")
	b.Int(&c.MaxUserConns, "max-user-conns", d.MaxUserConns, "most connections of one user on this instance, beyond it HTTP 429")
	b.Duration(&c.RenewGranularity, "renew-granularity", d.RenewGranularity, "least time between two renewals of one user's session (across their connections on this instance)")
	b.Duration(&c.RenewFlushInterval, "renew-flush-interval", d.RenewFlushInterval, "longest a renewal waits to share a Redis round trip")
	b.Int(&c.RenewBatch, "renew-batch", d.RenewBatch, "renewals that fill a Redis round trip")
	b.Duration(&c.HeartbeatInterval, "heartbeat-interval", d.HeartbeatInterval, "how often this instance tells Redis it is alive (lease: 3 intervals)")
	b.Duration(&c.ShedAfter, "shed-after", d.ShedAfter, "close clients' connections (1013) once Redis has been out of reach this long, so they reconnect elsewhere; 0 never")
}

// LoadConfig reads the gateway's settings from args and env.
func LoadConfig(args []string, env config.Lookup) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
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
	if err := c.Closing.Validate(); err != nil {
		return err
	}
	switch {
	case c.InstanceID != "" && !validInstanceID(c.InstanceID):
		return fmt.Errorf("instance-id: %q, want 1-128 characters of [A-Za-z0-9._:@-]", c.InstanceID)
	case c.Addr == "":
		return errors.New("gateway-addr: empty")
	case c.PushAddr == "":
		return errors.New("push-addr: empty")
	case len(c.TokenSecret) < token.MinSecretLen:
		return fmt.Errorf("token-secret: %d bytes, want at least %d", len(c.TokenSecret), token.MinSecretLen)
	case push.CheckSecret(c.PushSecret) != nil:
		return push.CheckSecret(c.PushSecret)
	case activity.CheckSecret(c.ActivitySecret, c.PushSecret) != nil:
		return activity.CheckSecret(c.ActivitySecret, c.PushSecret)
	case timeline.CheckSecret(c.OpsSecret, c.PushSecret, c.ActivitySecret, c.TokenSecret) != nil:
		return timeline.CheckSecret(c.OpsSecret, c.PushSecret, c.ActivitySecret, c.TokenSecret)
	case c.Timeline.Validate() != nil:
		return c.Timeline.Validate()
	case c.ActivityFeed.Enabled && c.ActivityFeed.WithDefaults().Validate() != nil:
		return c.ActivityFeed.WithDefaults().Validate()
	case c.TokenMaxLifetime < 0:
		return fmt.Errorf("token-max-lifetime: %v, want 0 (no limit) or more", c.TokenMaxLifetime)
	case c.SessionTTL < time.Second:
		return fmt.Errorf("session-ttl: %v, want at least 1s", c.SessionTTL)
	case c.SessionJitter < 0 || c.SessionJitter > c.SessionTTL:
		return fmt.Errorf("session-jitter: %v, want between 0 and session-ttl", c.SessionJitter)
	case c.PolicyRefresh < 100*time.Millisecond:
		return fmt.Errorf("policy-refresh: %v, want at least 100ms", c.PolicyRefresh)
	case c.ReadLimit < minReadLimit:
		return fmt.Errorf("read-limit: %d, want at least %d, so that an auth frame with a token of %d characters fits", c.ReadLimit, minReadLimit, frame.MaxTokenLen)
	case checkReadMode(c.ReadMode) != nil:
		return fmt.Errorf("read-mode: %w", checkReadMode(c.ReadMode))
	case c.RateBurst < 1:
		return fmt.Errorf("rate-burst: %d, want at least 1", c.RateBurst)
	case c.RatePerSecond <= 0:
		return fmt.Errorf("rate-per-second: %v, want more than 0", c.RatePerSecond)
	case c.IdleTimeout < time.Second:
		return fmt.Errorf("idle-timeout: %v, want at least 1s", c.IdleTimeout)
	case c.WriteTimeout <= 0:
		return fmt.Errorf("write-timeout: %v, want more than 0", c.WriteTimeout)
	case c.HandshakeTimeout <= 0:
		return fmt.Errorf("handshake-timeout: %v, want more than 0", c.HandshakeTimeout)
	case c.PushIdleTimeout < 0 || (c.PushIdleTimeout > 0 && c.PushIdleTimeout < 100*time.Millisecond):
		return fmt.Errorf("push-idle-timeout: %v, want at least 100ms (0 for the default, 120s)", c.PushIdleTimeout)
	case c.SendQueue < 1:
		return fmt.Errorf("send-queue: %d, want at least 1", c.SendQueue)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("shutdown-timeout: %v, want more than 0", c.ShutdownTimeout)
	case c.InboxSize < 1 || c.InboxSize > 1000:
		return fmt.Errorf("inbox-size: %d, want between 1 and 1000", c.InboxSize)
	case c.InboxTTL < time.Minute:
		return fmt.Errorf("inbox-ttl: %v, want at least 1m", c.InboxTTL)
	case c.GuideMaxAge < 0 || (c.GuideMaxAge > 0 && c.GuideMaxAge < time.Second):
		return fmt.Errorf("guide-max-age: %v, want at least 1s (0 for the default, 5m)", c.GuideMaxAge)
	case c.MaxConns < 0:
		return fmt.Errorf("max-conns: %d, want 0 (from the open-file limit) or more", c.MaxConns)
	case c.MaxUserConns < 0:
		return fmt.Errorf("max-user-conns: %d, want at least 1 (0 for the default, %d)", c.MaxUserConns, defaultMaxUserConns)
	case c.RenewGranularity < 0 || c.RenewGranularity > c.SessionTTL/2:
		return fmt.Errorf("renew-granularity: %v, want between 0 and half the session-ttl %v (%v): a client pinging just faster than the granularity would lapse", c.RenewGranularity, c.SessionTTL, c.SessionTTL/2)
	case c.RenewFlushInterval <= 0 || c.RenewFlushInterval > time.Second:
		return fmt.Errorf("renew-flush-interval: %v, want more than 0 and at most 1s", c.RenewFlushInterval)
	case c.RenewBatch < 1:
		return fmt.Errorf("renew-batch: %d, want at least 1", c.RenewBatch)
	case c.HeartbeatInterval < 100*time.Millisecond || c.HeartbeatInterval > 10*time.Second:
		return fmt.Errorf("heartbeat-interval: %v, want between 100ms and 10s", c.HeartbeatInterval)
	case c.ShedAfter < 0 || c.ShedAfter > 10*time.Minute:
		return fmt.Errorf("shed-after: %v, want between 0 (never) and 10m", c.ShedAfter)
	}
	return nil
}

// GCPercent is the gateway's garbage collector goal, unless the GOGC
// environment variable says otherwise: the heap may grow by half the
// live heap between collections, where Go's default lets it double. A
// gateway's heap is mostly its connections' state, which lives for
// hours, and a ping leaves little garbage behind, so the tighter goal
// keeps its memory near what the connections hold (bench/report.md,
// step 1) for little CPU.
const GCPercent = 50
