package expiry

import (
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisconn"
)

// TestConfig is DefaultConfig made for a test on Redis at rc and Kafka at
// brokers, spooling to spoolDir (each listener its own, as each pod):
// an admin listener on a port the kernel picks, quick sweeps, a grace of
// seconds to match the tests' TTLs, and no brake. It is the one config
// every test starts a listener from (this package's own tests, which
// cannot import a test-support package that imports this one, included);
// a test changes what it is about on the copy it gets.
func TestConfig(rc redisconn.Config, brokers []string, spoolDir string) Config {
	c := DefaultConfig()
	c.Redis = rc
	c.Kafka.Brokers, c.Kafka.Partitions = brokers, 4
	c.AdminAddr = "127.0.0.1:0"
	c.SweepInterval = 50 * time.Millisecond
	// Read ahead often, so that a deadline written inside a window read
	// already (the tests' TTLs are short) is found soon.
	c.PrefetchInterval = 100 * time.Millisecond
	c.ProduceTimeout = time.Second
	c.SpoolDir, c.SpoolMaxBytes = spoolDir, 1<<20
	c.OutageGrace = TestGrace
	c.SweepGapMax = time.Second
	// The brake only where a test asks for it.
	c.MassExpiryShare, c.MassExpiryFloor = 1, 1<<30
	// One stage, the reminder: the tests that are about a close stage
	// store a policy with one.
	c.Closing = policy.Closing{}
	return c
}

// TestGrace is TestConfig's outage grace: short, as the tests' TTLs are.
const TestGrace = 3 * time.Second
