package canary

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/activity"
	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/promise"
	"github.com/stillthere/stillthere/pkg/userid"
)

// inFlight is how close to a deadline a signal may be sent and still land
// on either side of it (promise.Config.InFlight): a ping's trip to Redis
// and back, with room for a busy gateway.
const inFlight = time.Second

// maxCheckInterval bounds canary-check-interval: the chart's
// StillthereCanaryStopped fires when the checker has not reported for 2
// minutes, so that a longer interval would look stopped between checks.
const maxCheckInterval = time.Minute

// Config is the canary's. Every field has a flag and an environment
// variable (STILLTHERE_ and the flag's name); the defaults are
// DefaultConfig's.
type Config struct {
	// URL is the gateway's public WebSocket endpoint, ws:// or wss://
	// (canary-url). Required.
	URL string
	// ActivityURL is the gateway's activity endpoint
	// (http://<internal>/v1/activity, canary-activity-url); empty: no
	// user is fed by the activity API.
	ActivityURL string
	// ActivitySecret is the activity API's bearer secret
	// (activity-secret, the gateway's).
	ActivitySecret string
	// TokenSecret signs the users' tokens as the platform's login does
	// (token-secret, the gateway's), or TokenSecretFile names a file that
	// holds it (token-secret-file); the file wins.
	TokenSecret     string
	TokenSecretFile string
	// TokenIssuer and TokenAudience are the iss and aud the gateways
	// require of client tokens (token-issuer, token-audience, the
	// gateway's); empty: none.
	TokenIssuer, TokenAudience string

	// Segment is the canary segment (canary-segment, "canary"): its users'
	// tokens and activity name it. The operator gives it a short TTL and
	// its stages with "gateway policy set"; TTL, Jitter and StageDelays
	// must say the same.
	Segment string
	// TTL is the segment's session TTL (canary-ttl, 30s), Jitter the
	// policy's jitter (canary-jitter, 5s).
	TTL, Jitter time.Duration
	// StageDelays are the segment's later stages' delays, each after the
	// one before (canary-stage-delays, "30s": a reminder, then a close 30s
	// later); "none": one stage.
	StageDelays []time.Duration

	// Users of each kind (canary-stayers 2, canary-leavers 4,
	// canary-feed-stayers 0, canary-feed-leavers 0). Stayers ping every
	// TTL/3 and are owed no guide; leavers ping LeavePings times, then go
	// silent with the connection open and wait for their stages. Feed
	// users signal through the activity API instead of pings, and hold a
	// WebSocket only to receive.
	Stayers, Leavers, FeedStayers, FeedLeavers int
	// LeavePings is how many signals a leaver sends before its silence
	// (canary-leave-pings, 3).
	LeavePings int
	// StayFor is how long a stayer's cycle lasts before it leaves with a
	// normal close and starts over as a new uid (canary-stay-for, 10m).
	StayFor time.Duration

	// Slack is how late past its due time a stage may come and be on time
	// (canary-slack, 10s): detection and delivery. The jitter is added for
	// the checker, since an activity event's grant is known only to within
	// it.
	Slack time.Duration
	// AnswerTimeout bounds the wait for a ping's answer or an activity
	// call (canary-answer-timeout, 5s): a signal without an answer by then
	// is recorded as NoAnswer.
	AnswerTimeout time.Duration
	// CheckInterval is how often the checker runs (canary-check-interval,
	// 10s, at most 1m); Window bounds the history a cycle may hold
	// (canary-window, 15m): StayFor and a leaver's cycle must fit in it.
	CheckInterval, Window time.Duration
	// AdminAddr serves /healthz, /readyz and /metrics
	// (canary-admin-addr, ":9095").
	AdminAddr string
	// UIDPrefix starts every canary uid (canary-uid-prefix, "canary"): a
	// uid is prefix-run-role-n-cycle, a fresh one each cycle.
	UIDPrefix string
}

// DefaultConfig is the canary's configuration before flags and
// environment.
func DefaultConfig() Config {
	return Config{
		Segment:       "canary",
		TTL:           30 * time.Second,
		Jitter:        5 * time.Second,
		StageDelays:   []time.Duration{30 * time.Second},
		Stayers:       2,
		Leavers:       4,
		LeavePings:    3,
		StayFor:       10 * time.Minute,
		Slack:         10 * time.Second,
		AnswerTimeout: 5 * time.Second,
		CheckInterval: 10 * time.Second,
		Window:        15 * time.Minute,
		AdminAddr:     ":9095",
		UIDPrefix:     "canary",
	}
}

// LoadConfig reads the canary's flags from args, with the environment as
// their defaults, and validates the result.
func LoadConfig(args []string, env config.Lookup) (Config, error) {
	d := DefaultConfig()
	c := d
	fs := flag.NewFlagSet("gateway canary", flag.ContinueOnError)
	b := config.NewBinder(fs, env)
	b.String(&c.URL, "canary-url", "", "the gateway's public WebSocket endpoint, ws:// or wss://")
	b.String(&c.ActivityURL, "canary-activity-url", "", "the gateway's activity endpoint (http://<internal>/v1/activity); empty: no user fed by the activity API")
	b.Secret(&c.ActivitySecret, "activity-secret", "bearer secret of the activity API")
	b.Secret(&c.TokenSecret, "token-secret", "secret that signs client tokens")
	b.String(&c.TokenSecretFile, "token-secret-file", "", "file holding the token secret; wins over token-secret")
	b.String(&c.TokenIssuer, "token-issuer", "", "iss of the users' tokens, as the gateways require; empty: none")
	b.String(&c.TokenAudience, "token-audience", "", "aud of the users' tokens, as the gateways require; empty: none")
	b.String(&c.Segment, "canary-segment", d.Segment, "the canary segment its users' tokens and events name")
	b.Duration(&c.TTL, "canary-ttl", d.TTL, "the canary segment's session TTL, as its policy sets it")
	b.Duration(&c.Jitter, "canary-jitter", d.Jitter, "the policy's jitter")
	var delays []string
	b.List(&delays, "canary-stage-delays", "30s", "the canary segment's later stages' delays, each after the one before; none: one stage")
	b.Int(&c.Stayers, "canary-stayers", d.Stayers, "users that ping and stay")
	b.Int(&c.Leavers, "canary-leavers", d.Leavers, "users that ping, then go silent and wait for their stages")
	b.Int(&c.FeedStayers, "canary-feed-stayers", d.FeedStayers, "users fed by the activity API that stay")
	b.Int(&c.FeedLeavers, "canary-feed-leavers", d.FeedLeavers, "users fed by the activity API that go silent")
	b.Int(&c.LeavePings, "canary-leave-pings", d.LeavePings, "signals a leaver sends before its silence")
	b.Duration(&c.StayFor, "canary-stay-for", d.StayFor, "how long a stayer stays before it starts over as a new uid")
	b.Duration(&c.Slack, "canary-slack", d.Slack, "how late past its due time a stage is still on time")
	b.Duration(&c.AnswerTimeout, "canary-answer-timeout", d.AnswerTimeout, "wait for a signal's answer")
	b.Duration(&c.CheckInterval, "canary-check-interval", d.CheckInterval, "how often the promise checker runs")
	b.Duration(&c.Window, "canary-window", d.Window, "the longest history a cycle may hold")
	b.String(&c.AdminAddr, "canary-admin-addr", d.AdminAddr, "health and metrics listener")
	b.String(&c.UIDPrefix, "canary-uid-prefix", d.UIDPrefix, "start of every canary uid")
	if err := b.Parse(args); err != nil {
		return c, err
	}
	var err error
	if c.StageDelays, err = parseDelays(delays); err != nil {
		return c, err
	}
	if c.TokenSecretFile != "" {
		raw, err := os.ReadFile(c.TokenSecretFile)
		if err != nil {
			return c, fmt.Errorf("token-secret-file: %w", err)
		}
		c.TokenSecret = strings.TrimSpace(string(raw))
	}
	return c, c.Validate()
}

// parseDelays reads canary-stage-delays; "none" is one stage.
func parseDelays(items []string) ([]time.Duration, error) {
	if len(items) == 1 && items[0] == "none" {
		return nil, nil
	}
	var out []time.Duration
	for _, s := range items {
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("canary-stage-delays: %q is not a duration such as 30s", s)
		}
		out = append(out, d)
	}
	return out, nil
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch u, err := url.Parse(c.URL); {
	case c.URL == "":
		return errors.New("canary-url: required")
	case err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "":
		return fmt.Errorf("canary-url: %q, want ws:// or wss:// with a host", c.URL)
	}
	if c.ActivityURL != "" {
		if u, err := url.Parse(c.ActivityURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("canary-activity-url: %q, want http:// or https:// with a host", c.ActivityURL)
		}
		if len(c.ActivitySecret) < activity.MinSecretLen {
			return fmt.Errorf("activity-secret: %d bytes, want at least %d", len(c.ActivitySecret), activity.MinSecretLen)
		}
	}
	if c.TokenSecret == "" {
		return errors.New("token-secret: required (or token-secret-file)")
	}
	if !userid.ValidSegment(c.Segment) {
		return fmt.Errorf("canary-segment: %q, want 1-64 characters of [A-Za-z0-9._-]", c.Segment)
	}
	if c.TTL < 2*time.Second {
		return fmt.Errorf("canary-ttl: %v, want 2s or more", c.TTL)
	}
	if c.Jitter < 0 {
		return fmt.Errorf("canary-jitter: %v, want 0 or more", c.Jitter)
	}
	for _, d := range c.StageDelays {
		if d < time.Second || d > 24*time.Hour {
			return fmt.Errorf("canary-stage-delays: %v, want 1s to 24h", d)
		}
	}
	for _, n := range []struct {
		name string
		n    int
	}{{"canary-stayers", c.Stayers}, {"canary-leavers", c.Leavers}, {"canary-feed-stayers", c.FeedStayers}, {"canary-feed-leavers", c.FeedLeavers}} {
		if n.n < 0 || n.n > 1000 {
			return fmt.Errorf("%s: %d, want 0 to 1000", n.name, n.n)
		}
	}
	if c.Stayers+c.Leavers+c.FeedStayers+c.FeedLeavers == 0 {
		return errors.New("canary-stayers: no users of any kind")
	}
	if c.FeedStayers+c.FeedLeavers > 0 && c.ActivityURL == "" {
		return errors.New("canary-activity-url: required for users fed by the activity API")
	}
	if c.LeavePings < 1 {
		return fmt.Errorf("canary-leave-pings: %d, want 1 or more", c.LeavePings)
	}
	if c.Slack < inFlight {
		return fmt.Errorf("canary-slack: %v, want %v or more", c.Slack, inFlight)
	}
	if c.AnswerTimeout <= 0 || c.AnswerTimeout > c.TTL {
		return fmt.Errorf("canary-answer-timeout: %v, want more than 0 and at most canary-ttl", c.AnswerTimeout)
	}
	if c.CheckInterval <= 0 || c.CheckInterval > maxCheckInterval {
		return fmt.Errorf("canary-check-interval: %v, want more than 0 and at most %v", c.CheckInterval, maxCheckInterval)
	}
	if c.StayFor < c.TTL {
		return fmt.Errorf("canary-stay-for: %v, want at least canary-ttl", c.StayFor)
	}
	if c.StayFor > c.Window {
		return fmt.Errorf("canary-stay-for: %v, want at most canary-window (%v)", c.StayFor, c.Window)
	}
	if t := c.cycleTimeout(); t > c.Window {
		return fmt.Errorf("canary-window: %v, want at least a leaver's cycle (%v)", c.Window, t)
	}
	if !userid.Valid(c.UIDPrefix) || len(c.UIDPrefix) > 64 {
		return fmt.Errorf("canary-uid-prefix: %q, want 1-64 characters of [A-Za-z0-9._:@-]", c.UIDPrefix)
	}
	return nil
}

// pingEvery is how often a user signals while it is there.
func (c Config) pingEvery() time.Duration { return c.TTL / 3 }

// grants reports whether a pong's TTL is one the canary segment's policy,
// as the canary is told it, grants: the TTL plus a jitter below Jitter,
// give or take the truncation and a shared renewal's age.
func (c Config) grants(ttl time.Duration) bool {
	const give = 250 * time.Millisecond
	return ttl >= c.TTL-give && ttl <= c.TTL+c.Jitter+give
}

// settle is how long after a signal's send it may be recorded: its
// answer's wait.
func (c Config) settle() time.Duration { return c.AnswerTimeout + inFlight }

// cycleTimeout bounds a leaver's cycle: its signals, then its silence,
// each stage's delay and its slack, and the settle time, so that every
// stage it is owed is judged before the cycle ends.
func (c Config) cycleTimeout() time.Duration {
	t := time.Duration(c.LeavePings)*c.pingEvery() + c.TTL + c.Jitter
	for _, d := range c.StageDelays {
		t += d
	}
	stages := time.Duration(len(c.StageDelays) + 1)
	return t + stages*(c.Slack+c.Jitter+c.settle())
}

// tokenLife is how long a cycle's token lasts: longer than any cycle.
func (c Config) tokenLife() time.Duration {
	return max(c.StayFor, c.cycleTimeout()) + time.Minute
}

// promise is what the checker is told the service promised the canary.
func (c Config) promise() promise.Config {
	return promise.Config{
		// An activity event's grant is known only to within the jitter.
		Slack:    c.Slack + c.Jitter,
		InFlight: inFlight,
		Match:    c.Jitter + 2*time.Second,
		Delays:   c.StageDelays,
		Window:   time.Minute,
	}
}
