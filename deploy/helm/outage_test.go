package helm

import (
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The gateway's defaults for a session (README.md, Configuration), which
// apply when the chart leaves them to it.
const (
	defaultSessionTTL    = 60 * time.Second
	defaultSessionJitter = 5 * time.Second
	// reconnectTime is what docs/operations.md allows clients to reconnect
	// after an outage, on top of a TTL and its jitter.
	reconnectTime = 10 * time.Second
)

// checkOutage: the settings of "a silence we caused is not a silence"
// reach the service that reads them, as the values give them, and no
// other; the grace lets every client ping again after an outage, and the
// gateways' heartbeat lease is shorter than a session.
func checkOutage(t *testing.T, m *manifests, pods map[string]*corev1.PodTemplateSpec, v values) {
	envs := map[string]map[string]string{}
	for _, c := range components {
		envs[c] = env(t, m, &pods[c].Spec.Containers[0])
	}
	l := v.Listener
	for _, s := range []struct{ component, name, want string }{
		{"gateway", "STILLTHERE_HEARTBEAT_INTERVAL", v.Gateway.HeartbeatInterval},
		{"expiry-listener", "STILLTHERE_OUTAGE_GRACE", l.OutageGrace},
		{"expiry-listener", "STILLTHERE_SWEEP_GAP_MAX", l.SweepGapMax},
		{"expiry-listener", "STILLTHERE_CLOCK_JUMP_MAX", l.ClockJumpMax},
		{"expiry-listener", "STILLTHERE_MASS_EXPIRY_SHARE", strconv.FormatFloat(l.MassExpiry.Share, 'g', -1, 64)},
		{"expiry-listener", "STILLTHERE_MASS_EXPIRY_FLOOR", strconv.Itoa(l.MassExpiry.Floor)},
		{"expiry-listener", "STILLTHERE_MASS_EXPIRY_WINDOW", l.MassExpiry.Window},
	} {
		if got := setting(t, envs[s.component], s.name); got != s.want {
			t.Errorf("%s: %s = %q, want %q from the values", s.component, s.name, got, s.want)
		}
		for _, other := range components {
			if _, ok := envs[other][s.name]; ok && other != s.component {
				t.Errorf("%s reaches %s too", s.name, other)
			}
		}
	}

	gw := envs["gateway"]
	ttl, jitter := defaultSessionTTL, defaultSessionJitter
	if _, ok := gw["STILLTHERE_SESSION_TTL"]; ok {
		ttl = duration(t, gw, "STILLTHERE_SESSION_TTL")
	}
	if _, ok := gw["STILLTHERE_SESSION_JITTER"]; ok {
		jitter = duration(t, gw, "STILLTHERE_SESSION_JITTER")
	}
	if grace := duration(t, envs["expiry-listener"], "STILLTHERE_OUTAGE_GRACE"); grace < ttl+jitter+reconnectTime {
		t.Errorf("outage-grace %v is under session-ttl %v + session-jitter %v + %v to reconnect", grace, ttl, jitter, reconnectTime)
	}
	if lease := 3 * duration(t, gw, "STILLTHERE_HEARTBEAT_INTERVAL"); lease >= ttl {
		t.Errorf("the heartbeat lease %v is not under session-ttl %v: a gateway cut off from Redis would be noticed after its users' deadlines", lease, ttl)
	}
}
