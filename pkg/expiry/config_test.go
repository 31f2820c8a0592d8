package expiry

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
)

func TestLoadConfig(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		c, err := LoadConfig(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.PrefetchInterval != 500*time.Millisecond || c.PrefetchAhead != time.Second || c.FireSlot != 10*time.Millisecond ||
			c.SafetySweepInterval != 5*time.Second {
			t.Fatalf("prefetch defaults = %v %v %v %v", c.PrefetchInterval, c.PrefetchAhead, c.FireSlot, c.SafetySweepInterval)
		}
		if c.Mode != ModeHybrid || c.SweepInterval != 200*time.Millisecond || c.SweepBatch != 256 ||
			c.DedupTTL != 120*time.Second || c.ProduceTimeout != 10*time.Second || c.AdminAddr != "127.0.0.1:8082" {
			t.Fatalf("defaults = %+v", c)
		}
	})
	t.Run("environment", func(t *testing.T) {
		env := map[string]string{
			config.EnvName("detect-mode"):    ModeSweep,
			config.EnvName("sweep-interval"): "50ms",
			config.EnvName("sweep-batch"):    "10",
		}
		lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
		c, err := LoadConfig([]string{"-sweep-batch", "20"}, lookup)
		if err != nil {
			t.Fatal(err)
		}
		if c.Mode != ModeSweep || c.SweepInterval != 50*time.Millisecond || c.SweepBatch != 20 {
			t.Fatalf("got mode %q, interval %v, batch %d; want sweep, 50ms, 20 (the flag wins)", c.Mode, c.SweepInterval, c.SweepBatch)
		}
	})
	t.Run("pprof", func(t *testing.T) {
		for value, want := range map[string]bool{"": false, "false": false, "true": true} {
			env := map[string]string{config.EnvName("pprof"): value}
			c, err := LoadConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			if err != nil || c.Pprof != want {
				t.Errorf("STILLTHERE_PPROF=%q: Pprof %v, %v; want %v", value, c.Pprof, err, want)
			}
		}
	})
	t.Run("invalid", func(t *testing.T) {
		lookup := func(k string) (string, bool) {
			if k == config.EnvName("detect-mode") {
				return "poll", true
			}
			return "", false
		}
		if _, err := LoadConfig(nil, lookup); err == nil || !strings.HasPrefix(err.Error(), "detect-mode:") {
			t.Fatalf("LoadConfig with detect-mode poll: %v; want a detect-mode error", err)
		}
	})
}

func TestValidate(t *testing.T) {
	valid, err := LoadConfig(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		field  string // the error's first word; "" means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"events mode", func(c *Config) { c.Mode = ModeEvents }, ""},
		{"sweep mode", func(c *Config) { c.Mode = ModeSweep }, ""},
		{"smallest settings", func(c *Config) {
			c.SweepInterval, c.SweepBatch, c.DedupTTL, c.ProduceTimeout = 10*time.Millisecond, 1, time.Minute, time.Second
		}, ""},
		{"largest settings", func(c *Config) { c.SweepInterval, c.SweepBatch, c.SweepGapMax = time.Minute, 10000, 2*time.Minute }, ""},
		{"sweep gap under two sweeps", func(c *Config) { c.SweepInterval, c.SweepGapMax = time.Second, 1999*time.Millisecond }, "sweep-gap-max"},
		{"no grace", func(c *Config) { c.OutageGrace = 0 }, "outage-grace"},
		{"grace over a day", func(c *Config) { c.OutageGrace = 25 * time.Hour }, "outage-grace"},
		{"clock jump too small", func(c *Config) { c.ClockJumpMax = 99 * time.Millisecond }, "clock-jump-max"},
		{"no brake share", func(c *Config) { c.MassExpiryShare = 0 }, "mass-expiry-share"},
		{"brake share over 1", func(c *Config) { c.MassExpiryShare = 1.01 }, "mass-expiry-share"},
		{"brake share NaN", func(c *Config) { c.MassExpiryShare = math.NaN() }, "mass-expiry-share"},
		{"no brake floor", func(c *Config) { c.MassExpiryFloor = 0 }, "mass-expiry-floor"},
		{"brake window too short", func(c *Config) { c.MassExpiryWindow = 999 * time.Millisecond }, "mass-expiry-window"},
		{"negative brake release rate", func(c *Config) { c.MassExpiryReleaseRate = -1 }, "mass-expiry-release-rate"},
		{"brake release rate past a million", func(c *Config) { c.MassExpiryReleaseRate = 1_000_001 }, "mass-expiry-release-rate"},

		{"prefetch off", func(c *Config) { c.PrefetchInterval, c.PrefetchAhead, c.FireSlot, c.SafetySweepInterval = 0, 0, 0, 0 }, ""},
		{"prefetch interval too short", func(c *Config) { c.PrefetchInterval = 9 * time.Millisecond }, "prefetch-interval"},
		{"prefetch interval over half the sweep gap", func(c *Config) { c.PrefetchInterval = 1001 * time.Millisecond }, "prefetch-interval"},
		{"prefetch interval negative", func(c *Config) { c.PrefetchInterval = -time.Second }, "prefetch-interval"},
		{"prefetch ahead under the interval", func(c *Config) { c.PrefetchAhead = 499 * time.Millisecond }, "prefetch-ahead"},
		{"prefetch ahead over a minute", func(c *Config) { c.PrefetchAhead = time.Minute + 1 }, "prefetch-ahead"},
		{"fire slot zero", func(c *Config) { c.FireSlot = 0 }, "fire-slot"},
		{"fire slot over the interval", func(c *Config) { c.FireSlot = 501 * time.Millisecond }, "fire-slot"},
		{"safety sweep zero", func(c *Config) { c.SafetySweepInterval = 0 }, "safety-sweep-interval"},
		{"safety sweep too long", func(c *Config) { c.SafetySweepInterval = 10*time.Minute + 1 }, "safety-sweep-interval"},
		{"smallest prefetch settings", func(c *Config) {
			c.PrefetchInterval, c.PrefetchAhead, c.FireSlot, c.SafetySweepInterval = 10*time.Millisecond, 10*time.Millisecond, time.Millisecond, 10*time.Millisecond
		}, ""},

		{"no redis", func(c *Config) { c.Redis.Addrs = nil }, "redis-addrs"},
		{"bad key prefix", func(c *Config) { c.Redis.KeyPrefix = "a:b" }, "key-prefix"},
		{"no kafka", func(c *Config) { c.Kafka.Brokers = nil }, "kafka-brokers"},
		{"no admin addr", func(c *Config) { c.AdminAddr = "" }, "listener-admin-addr"},
		{"empty mode", func(c *Config) { c.Mode = "" }, "detect-mode"},
		{"unknown mode", func(c *Config) { c.Mode = "Hybrid" }, "detect-mode"},
		{"sweep interval zero", func(c *Config) { c.SweepInterval = 0 }, "sweep-interval"},
		{"sweep interval too short", func(c *Config) { c.SweepInterval = 9 * time.Millisecond }, "sweep-interval"},
		{"sweep interval too long", func(c *Config) { c.SweepInterval = time.Minute + 1 }, "sweep-interval"},
		{"sweep batch zero", func(c *Config) { c.SweepBatch = 0 }, "sweep-batch"},
		{"sweep batch negative", func(c *Config) { c.SweepBatch = -1 }, "sweep-batch"},
		{"sweep batch too big", func(c *Config) { c.SweepBatch = 10001 }, "sweep-batch"},
		{"dedup ttl zero", func(c *Config) { c.DedupTTL = 0 }, "dedup-ttl"},
		{"dedup ttl under a minute", func(c *Config) { c.DedupTTL = 59 * time.Second }, "dedup-ttl"},
		{"produce timeout zero", func(c *Config) { c.ProduceTimeout = 0 }, "produce-timeout"},
		{"produce timeout under a second", func(c *Config) { c.ProduceTimeout = 999 * time.Millisecond }, "produce-timeout"},
		{"no spool dir", func(c *Config) { c.SpoolDir = "" }, "spool-dir"},
		{"spool cap too small", func(c *Config) { c.SpoolMaxBytes = 65535 }, "spool-max-bytes"},
		{"smallest spool cap", func(c *Config) { c.SpoolMaxBytes = 65536 }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			c.Redis.Addrs = append([]string(nil), valid.Redis.Addrs...)
			c.Kafka.Brokers = append([]string(nil), valid.Kafka.Brokers...)
			tt.mutate(&c)
			err := c.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.field+":") {
				t.Fatalf("Validate() = %v, want an error naming %s", err, tt.field)
			}
		})
	}
}

// TestTimelineConfig: the listener records in users' timelines by
// default, with the gateways' default bounds, and refuses bad ones.
func TestTimelineConfig(t *testing.T) {
	c, err := LoadConfig(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Timeline.Off || c.Timeline.Bounds.Entries != 100 || c.Timeline.Bounds.Keep != 24*time.Hour {
		t.Fatalf("timeline defaults = %+v, want on, 100 entries, 24h", c.Timeline)
	}
	if _, err := LoadConfig([]string{"-timeline-entries", "0"}, nil); err == nil || !strings.HasPrefix(err.Error(), "timeline-entries:") {
		t.Fatalf("timeline-entries 0: %v, want a timeline-entries error", err)
	}
	if c, err := LoadConfig([]string{"-timeline-off"}, nil); err != nil || !c.Timeline.Off {
		t.Fatalf("timeline-off: %+v, %v", c.Timeline, err)
	}
}
