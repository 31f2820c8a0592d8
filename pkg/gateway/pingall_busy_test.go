package gateway

import (
	"runtime"
	"testing"
	"time"
)

// TestQuietClientSurvivesSchedulerLatency: a quiet client that answers
// every protocol ping stays connected on a starved gateway, whose timers
// fire late. Here its one processor is shared with a goroutine that
// spins between yields (a saturated instance, a throttled container):
// pingAll's ticks come late or are dropped, and its pings must still
// leave the pong the last tenth of the idle timeout (400 ms). That the
// shards' turns keep their pace however the ticks come is
// TestPingRoundKeepsItsPace's; a schedule of one shard per tick failed
// this test under a 2 s timeout, and passes it under 4 s, which a busy
// host needs for the pong's round trip.
func TestQuietClientSurvivesSchedulerLatency(t *testing.T) {
	const idle = 4 * time.Second
	const slice = 20 * time.Millisecond // the busy goroutine's run between yields
	tg := startGateway(t, func(c *Config) { c.IdleTimeout = idle })
	quiet := dialAnswering(t, tg, "quiet")
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			for end := time.Now().Add(slice); time.Now().Before(end); {
			}
			runtime.Gosched()
		}
	}()
	// Three idle timeouts: what is tested is that nothing happens in them.
	select {
	case err := <-quiet.ended:
		t.Fatalf("a quiet client that answered all %d protocol pings was dropped: %v", quiet.pings.Load(), err)
	case <-time.After(3 * idle):
	}
	if quiet.pings.Load() < 2 {
		t.Errorf("the quiet client got %d protocol pings in three idle timeouts; want 2 or more", quiet.pings.Load())
	}
	if len(tg.hub.lookup("quiet")) != 1 {
		t.Fatal("the quiet client's connection is gone")
	}
}
