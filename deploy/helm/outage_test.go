package helm

import (
	"strconv"
	"strings"
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
// other; the grace lets every client ping again after an outage, and
// those a gateway sheds reconnect within it; the gateways' heartbeat lease
// is shorter than a session.
func checkOutage(t *testing.T, m *manifests, pods map[string]*corev1.PodTemplateSpec, v values) {
	envs := map[string]map[string]string{}
	for _, c := range components {
		envs[c] = env(t, m, &pods[c].Spec.Containers[0])
	}
	l := v.Listener
	for _, s := range []struct{ component, name, want string }{
		{"gateway", "STILLTHERE_HEARTBEAT_INTERVAL", v.Gateway.HeartbeatInterval},
		{"gateway", "STILLTHERE_SHED_AFTER", v.Gateway.ShedAfter},
		{"expiry-listener", "STILLTHERE_OUTAGE_GRACE", l.OutageGrace},
		{"expiry-listener", "STILLTHERE_SWEEP_GAP_MAX", l.SweepGapMax},
		{"expiry-listener", "STILLTHERE_CLOCK_JUMP_MAX", l.ClockJumpMax},
		{"expiry-listener", "STILLTHERE_MASS_EXPIRY_SHARE", strconv.FormatFloat(l.MassExpiry.Share, 'g', -1, 64)},
		{"expiry-listener", "STILLTHERE_MASS_EXPIRY_FLOOR", strconv.Itoa(l.MassExpiry.Floor)},
		{"expiry-listener", "STILLTHERE_MASS_EXPIRY_WINDOW", l.MassExpiry.Window},
		{"expiry-listener", "STILLTHERE_MASS_EXPIRY_RELEASE_RATE", strconv.Itoa(l.MassExpiry.ReleaseRate)},
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
	grace := duration(t, envs["expiry-listener"], "STILLTHERE_OUTAGE_GRACE")
	if grace < ttl+jitter+reconnectTime {
		t.Errorf("outage-grace %v is under session-ttl %v + session-jitter %v + %v to reconnect", grace, ttl, jitter, reconnectTime)
	}
	if shed := duration(t, gw, "STILLTHERE_SHED_AFTER"); shed > 0 && shed+reconnectTime >= grace {
		t.Errorf("shed-after %v + %v to reconnect is not under outage-grace %v: clients shed by a gateway cut off from Redis would be back after the grace", shed, reconnectTime, grace)
	}
	if lease := 3 * duration(t, gw, "STILLTHERE_HEARTBEAT_INTERVAL"); lease >= ttl {
		t.Errorf("the heartbeat lease %v is not under session-ttl %v: a gateway cut off from Redis would be noticed after its users' deadlines", lease, ttl)
	}
}

// TestChartShedAfterNever: gateway.shedAfter 0, as a number or a string,
// reaches the gateway as never shedding, and then the grace need not
// cover it: a grace that shedding after 1s would not fit in renders.
func TestChartShedAfterNever(t *testing.T) {
	short := []string{"--set", "secrets.existingSecret=stillthere", "--set", "gateway.sessionTTL=1s", "--set", "gateway.sessionJitter=0s", "--set", "listener.outageGrace=11s"}
	if _, err := render(t, append(short, "--set", "gateway.shedAfter=1s")...); err == nil || !strings.Contains(err.Error(), "gateway.shedAfter: 1s + 10s to reconnect is not under listener.outageGrace 11s") {
		t.Fatalf("shedAfter 1s with an 11s grace: got %v, want the chart to refuse it", err)
	}
	for _, set := range [][]string{
		{"--set", "gateway.shedAfter=0"},
		{"--set-string", "gateway.shedAfter=0"},
		{"--set", "gateway.shedAfter=0s"},
	} {
		out, err := render(t, append(short, set...)...)
		if err != nil {
			t.Fatalf("%q: %v", set, err)
		}
		m, err := decode(out)
		if err != nil {
			t.Fatalf("%q: decoding the rendered chart strictly:\n%v", set, err)
		}
		cm := m.configMaps[fullname+"-gateway"]
		if cm == nil {
			t.Fatalf("%q: no ConfigMap %s-gateway", set, fullname)
		}
		got, ok := cm.Data["STILLTHERE_SHED_AFTER"]
		if !ok {
			t.Fatalf("%q: STILLTHERE_SHED_AFTER is not set", set)
		}
		if d, err := time.ParseDuration(got); err != nil || d != 0 {
			t.Errorf("%q: STILLTHERE_SHED_AFTER = %q, want 0", set, got)
		}
	}
}

// TestChartPrefetchOff: prefetch-interval 0, as a number or a string,
// turns the read-ahead off, and then sweepGapMax need only cover the
// sweep: a gap the default read-ahead would not fit in renders.
func TestChartPrefetchOff(t *testing.T) {
	short := []string{"--set", "secrets.existingSecret=stillthere", "--set", "listener.sweepGapMax=800ms"}
	if _, err := render(t, short...); err == nil || !strings.Contains(err.Error(), "want at least twice prefetch-interval (500ms)") {
		t.Fatalf("sweepGapMax 800ms with the default read-ahead: got %v, want the chart to refuse it", err)
	}
	for _, set := range [][]string{
		{"--set", "listener.config.prefetch-interval=0"},
		{"--set-string", "listener.config.prefetch-interval=0"},
		{"--set", "config.STILLTHERE_PREFETCH_INTERVAL=0s"},
	} {
		if _, err := render(t, append(short, set...)...); err != nil {
			t.Errorf("%q: %v", set, err)
		}
	}
}

// TestChartReadMode: gateway.readMode reaches the gateway alone; empty
// leaves the gateway its own default.
func TestChartReadMode(t *testing.T) {
	for _, tc := range []struct{ mode, want string }{{"", ""}, {"goroutine", "goroutine"}, {"epoll", "epoll"}} {
		out, err := render(t, "--set", "secrets.existingSecret=stillthere", "--set", "gateway.readMode="+tc.mode)
		if err != nil {
			t.Fatalf("readMode %q: %v", tc.mode, err)
		}
		m, err := decode(out)
		if err != nil {
			t.Fatalf("readMode %q: decoding the rendered chart strictly:\n%v", tc.mode, err)
		}
		for name, cm := range m.configMaps {
			got, ok := cm.Data["STILLTHERE_READ_MODE"]
			switch {
			case name == fullname+"-gateway" && got != tc.want:
				t.Errorf("readMode %q: %s has STILLTHERE_READ_MODE %q, want %q", tc.mode, name, got, tc.want)
			case name != fullname+"-gateway" && ok:
				t.Errorf("readMode %q: STILLTHERE_READ_MODE reaches %s", tc.mode, name)
			}
		}
	}
}
