package main

import (
	"slices"
	"strings"
	"testing"
)

const exposition = `# HELP stillthere_listener_held_total Timeouts held.
# TYPE stillthere_listener_held_total counter
stillthere_listener_held_total{rule="blind"} 3
stillthere_listener_held_total{rule="mass-expiry"} 2
stillthere_listener_held_total{rule="minute"} 0
stillthere_listener_held_total_extra 100
stillthere_listener_replayed_total 7
stillthere_consumer_guides_total{outcome="stale"} 1.5e+01
`

func TestSample(t *testing.T) {
	for _, tc := range []struct {
		metric, label string
		want          float64
	}{
		{"stillthere_listener_held_total", "", 5},
		{"stillthere_listener_held_total", `rule="mass-expiry"`, 2},
		{"stillthere_listener_held_total", `rule="minute"`, 0},
		{"stillthere_listener_replayed_total", "", 7},
		{"stillthere_consumer_guides_total", `outcome="stale"`, 15},
		{"stillthere_gateway_resynced_total", "", 0},
	} {
		if got := sample(strings.NewReader(exposition), tc.metric, tc.label); got != tc.want {
			t.Errorf("%s{%s}: %v, want %v", tc.metric, tc.label, got, tc.want)
		}
	}
}

func TestCoverageSumsStartsAndNamesWhatNeverRan(t *testing.T) {
	c := newCoverage()
	c.last["listener-0#1"] = map[string]float64{"hold (any rule)": 4, "spool replay": 0}
	c.last["listener-0#2"] = map[string]float64{"hold (any rule)": 1, "mass-expiry brake": 1}
	c.last["gateway-1#1"] = map[string]float64{"resync": 2}
	tot := c.totals()
	if tot["hold (any rule)"] != 5 || tot["resync"] != 2 || tot["spool replay"] != 0 {
		t.Fatalf("totals %v", tot)
	}
	tot[rebalancePath] = 1
	want := []string{"deferred minute", "spool replay", "stale mark"}
	if got := missed(tot); !slices.Equal(got, want) {
		t.Fatalf("missed %v, want %v", got, want)
	}
}
