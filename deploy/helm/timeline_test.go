package helm

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// timelineValues are timeline.* of the chart's values.
type timelineValues struct {
	Enabled bool   `json:"enabled"`
	Entries int    `json:"entries"`
	Keep    string `json:"keep"`
}

// timelineEnv are the settings timeline.* sets, as in pkg/timeline.
var timelineEnv = []string{"STILLTHERE_TIMELINE_OFF", "STILLTHERE_TIMELINE_ENTRIES", "STILLTHERE_TIMELINE_KEEP"}

// checkTimeline: every service runs with timeline.*, from the common
// config map alone, so that no service trims the timelines shorter or
// keeps them longer than the others.
func checkTimeline(t *testing.T, m *manifests, pods map[string]*corev1.PodTemplateSpec, v timelineValues) {
	want := map[string]string{
		"STILLTHERE_TIMELINE_OFF":     strconv.FormatBool(!v.Enabled),
		"STILLTHERE_TIMELINE_ENTRIES": strconv.Itoa(v.Entries),
		"STILLTHERE_TIMELINE_KEEP":    v.Keep,
	}
	for _, c := range components {
		envs := env(t, m, &pods[c].Spec.Containers[0])
		for name, w := range want {
			if got, ok := envs[name]; !ok || got != w {
				t.Errorf("%s: %s = %q (set: %v), want %q from timeline.*", c, name, got, ok, w)
			}
		}
	}
	common := m.configMaps[fullname+"-common"]
	if common == nil {
		t.Fatalf("no ConfigMap %s-common", fullname)
	}
	for cmName, cm := range m.configMaps {
		for _, name := range timelineEnv {
			if _, ok := cm.Data[name]; ok != (cm == common) {
				t.Errorf("ConfigMap %s: %s set %v, want it in %s-common only", cmName, name, ok, fullname)
			}
		}
	}
}

// TestChartTimeline: timeline.* reaches the three services alike, its
// defaults the services' own; the chart refuses it out of range, and
// anywhere else, where one service's bounds could differ from the others'.
func TestChartTimeline(t *testing.T) {
	base := slices.Clone(secretValues)
	for _, tc := range []struct {
		name string
		args []string
		want timelineValues
	}{
		{"the defaults", nil, timelineValues{Enabled: true, Entries: 100, Keep: "24h"}},
		{"off", []string{"--set", "timeline.enabled=false"}, timelineValues{Enabled: false, Entries: 100, Keep: "24h"}},
		{"the widest", []string{"--set", "timeline.entries=10000", "--set", "timeline.keep=720h"}, timelineValues{Enabled: true, Entries: 10000, Keep: "720h"}},
		{"the narrowest", []string{"--set", "timeline.entries=1", "--set", "timeline.keep=1m"}, timelineValues{Enabled: true, Entries: 1, Keep: "1m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.args == nil {
				// The defaults are values.yaml's: this case checks them too.
				if got := loadValues(t).Timeline; got != tc.want {
					t.Fatalf("values.yaml timeline = %+v, want %+v (the services' defaults)", got, tc.want)
				}
			}
			out, err := render(t, append(slices.Clone(base), tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			m, err := decode(out)
			if err != nil {
				t.Fatalf("decoding the rendered chart strictly:\n%v", err)
			}
			pods := map[string]*corev1.PodTemplateSpec{}
			for _, c := range components {
				d := m.deployments[fullname+"-"+c]
				if d == nil {
					t.Fatalf("no Deployment %s-%s", fullname, c)
				}
				pods[c] = &d.Spec.Template
			}
			checkTimeline(t, m, pods, tc.want)
		})
	}

	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no entries", []string{"--set", "timeline.entries=0"}, []string{"/timeline/entries", "minimum"}},
		{"too many entries", []string{"--set", "timeline.entries=10001"}, []string{"/timeline/entries", "maximum"}},
		{"kept too briefly", []string{"--set", "timeline.keep=59s"}, []string{"timeline.keep: 59s, want between 1m and 720h"}},
		{"kept too long", []string{"--set", "timeline.keep=721h"}, []string{"timeline.keep: 721h, want between 1m and 720h"}},
		{"keep not a duration", []string{"--set", "timeline.keep=1d"}, []string{"/timeline/keep"}},
		{"keep a number", []string{"--set", "timeline.keep=3600"}, []string{"/timeline/keep"}},
		{"the word off", []string{"--set", "timeline.off=true"}, []string{"/timeline", "off"}},
		{"entries through the common map", []string{"--set", "config.timeline-entries=5"}, []string{"config.timeline-entries", "STILLTHERE_TIMELINE_ENTRIES"}},
		{"off through the gateway's map", []string{"--set", "gateway.config.timeline-off=true"}, []string{"gateway.config.timeline-off", "STILLTHERE_TIMELINE_OFF"}},
		{"keep through the listener's map", []string{"--set", "listener.config.STILLTHERE_TIMELINE_KEEP=1h"}, []string{"listener.config.STILLTHERE_TIMELINE_KEEP", "STILLTHERE_TIMELINE_KEEP"}},
		{"entries through the consumer's map", []string{"--set", "consumer.config.timeline-entries=5"}, []string{"consumer.config.timeline-entries", "STILLTHERE_TIMELINE_ENTRIES"}},
		{"keep through the gateway's extraEnv", []string{"--set", "gateway.extraEnv[0].name=STILLTHERE_TIMELINE_KEEP", "--set", "gateway.extraEnv[0].value=1h"}, []string{"gateway.extraEnv", "STILLTHERE_TIMELINE_KEEP"}},
		{"off through the listener's extraEnv", []string{"--set", "listener.extraEnv[0].name=STILLTHERE_TIMELINE_OFF", "--set", "listener.extraEnv[0].value=true"}, []string{"listener.extraEnv", "STILLTHERE_TIMELINE_OFF"}},
		{"entries through the consumer's extraEnv", []string{"--set", "consumer.extraEnv[0].name=STILLTHERE_TIMELINE_ENTRIES", "--set", "consumer.extraEnv[0].value=5"}, []string{"consumer.extraEnv", "STILLTHERE_TIMELINE_ENTRIES"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, append(slices.Clone(base), tc.args...)...)
			if err == nil {
				t.Fatalf("helm template %q succeeded, want an error naming %q", tc.args, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}
