package main

import (
	"testing"
	"time"
)

// TestOutageGraceMeetsDocumentedMinimum: the listeners' outage grace must
// be at least the TTL (and its jitter, none here) plus the time clients
// take to reconnect (the operations guide). An hour-long run gave them
// the TTL and a second (5 s), while SIGSTOPs of a gateway lasted 5.1 to
// 5.8 s: users of the stopped gateway were released before they could
// have reconnected, and got guides the checker called spam. The default
// is that minimum, taken from the devices' own timing; a smaller -grace
// is refused; and the checker's grace of every fault follows it.
func TestOutageGraceMeetsDocumentedMinimum(t *testing.T) {
	s := settings{ttl: defaultTTL}
	if err := s.fill(); err != nil {
		t.Fatal(err)
	}
	// The clients' reconnect time, from the devices' timing: a device
	// that left a gateway answering nothing may hang on one more try (a
	// handshake, or a ping on its other connection), and pauses at most
	// redialMax after a failed dial.
	reconnect := max(handshakeTimeout, answerWait) + redialMax
	if least := s.ttl + reconnect; s.grace < least {
		t.Errorf("grace %v for a TTL of %v, want at least the TTL and the reconnect time, %v", s.grace, s.ttl, least)
	}
	// Within that TTL a device that is there has pinged (every ttl/3,
	// give or take a fifth) and left a gateway that did not answer.
	if gap := s.ttl/3*6/5 + answerWait; gap > s.grace-reconnect {
		t.Errorf("grace %v: a device pings and leaves within %v, more than the grace less the reconnect time", s.grace, gap)
	}
	// The run's case: a gateway stopped just before its next heartbeat
	// (the gateway's default interval, 1 s), its user's next ping
	// unanswered, one more try hanging, one pause after a failed dial,
	// then the ping that lands: held until then.
	if back := time.Second + s.ttl/3*6/5 + answerWait + max(handshakeTimeout, answerWait) + redialMin; s.grace < back {
		t.Errorf("grace %v: a stopped gateway's user pings again up to %v after its last heartbeat", s.grace, back)
	}
	if old := s.ttl + time.Second; old >= s.grace {
		t.Errorf("grace %v: no more than the old default, %v", s.grace, old)
	}

	// A smaller grace asked for is refused; the minimum or more is kept.
	for _, g := range []time.Duration{5 * time.Second, s.grace - time.Millisecond} {
		if err := (&settings{ttl: defaultTTL, grace: g}).fill(); err == nil {
			t.Errorf("-grace %v accepted for a TTL of %v", g, defaultTTL)
		}
	}
	more := settings{ttl: defaultTTL, grace: 20 * time.Second}
	if err := more.fill(); err != nil || more.grace != 20*time.Second {
		t.Errorf("-grace 20s: %v, %v", more.grace, err)
	}
	// A short TTL: the fixed answerWait counts in full.
	short := settings{ttl: time.Second}
	if err := short.fill(); err != nil || short.grace < time.Second/3*6/5+answerWait+reconnect {
		t.Errorf("TTL 1s: grace %v, %v", short.grace, err)
	}

	// The checker waits at least the listeners' grace past every fault.
	cfg := checkConfig(s)
	if cfg.Grace < s.grace {
		t.Errorf("the checker's grace %v, below the listeners' %v", cfg.Grace, s.grace)
	}
	r := &rig{s: s}
	for _, k := range kinds {
		if g := r.graceOf(k.name); g < cfg.Grace {
			t.Errorf("%s: the checker's grace %v, below its default %v", k.name, g, cfg.Grace)
		}
	}
}
