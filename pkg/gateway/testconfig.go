package gateway

import (
	"os"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisconn"
)

// Secrets of TestConfig, known to the tests that mint tokens and push.
const (
	TestTokenSecret = "0123456789abcdef0123456789abcdef"
	TestPushSecret  = "push-secret-push-secret-push-secret"
)

// TestConfig is DefaultConfig made for a test on Redis at rc: listeners
// on ports the kernel picks, the test secrets, and timings that let a
// test see in a second what takes a minute in production. It is the one
// config every test starts a gateway from (this package's own tests,
// which cannot import a test-support package that imports this one,
// included); a test changes what it is about on the copy it gets.
func TestConfig(rc redisconn.Config) Config {
	c := DefaultConfig()
	c.Redis = rc
	c.Addr, c.PushAddr = "127.0.0.1:0", "127.0.0.1:0"
	c.TokenSecret, c.PushSecret = TestTokenSecret, TestPushSecret
	c.SessionTTL, c.SessionJitter = 10*time.Second, time.Second
	// One stage, the reminder: the tests that are about a close stage
	// store a policy with one.
	c.Closing = policy.Closing{}
	// The suite runs in each read mode: the default, and the one the
	// gateway's environment setting names (make test runs it again in
	// goroutine mode).
	if m := os.Getenv("STILLTHERE_READ_MODE"); m != "" {
		c.ReadMode = m
	}
	c.PolicyRefresh = 100 * time.Millisecond
	c.HeartbeatInterval = 100 * time.Millisecond
	// Every ping renews, unless a test sets a granularity.
	c.RenewGranularity = 0
	c.WriteTimeout, c.HandshakeTimeout = 5*time.Second, 5*time.Second
	c.ShutdownTimeout = 5 * time.Second
	c.SendQueue = 8
	c.InboxSize, c.InboxTTL = 3, time.Hour
	// No limit on tokens' lifetime, and no shedding, unless a test is
	// about them.
	c.TokenMaxLifetime = 0
	c.ShedAfter = 0
	return c
}
