package main

import (
	"strings"
	"testing"
)

func TestActivityLatenessJudged(t *testing.T) {
	clean := LatenessOfFeed{Silent: 10, Active: 5, Guided: 10, P50ms: 280, P99ms: 700, Maxms: 750}
	for _, tc := range []struct {
		name   string
		mutate func(l *ActivityLateness)
		pass   bool
	}{
		{"every silent user once, none to one who was there", func(*ActivityLateness) {}, true},
		{"without a baseline", func(l *ActivityLateness) { l.Baseline = nil }, true},
		{"a topic-fed guide lost", func(l *ActivityLateness) { l.Topic.Lost, l.Topic.Guided = 1, 9 }, false},
		{"a WebSocket-fed guide doubled", func(l *ActivityLateness) { l.WebSocket.Doubled, l.WebSocket.Guided = 1, 9 }, false},
		{"an active topic-fed user guided", func(l *ActivityLateness) { l.Topic.ActiveGuided = 1 }, false},
		{"a user guided before the deadline earned", func(l *ActivityLateness) { l.WebSocket.Early, l.WebSocket.Guided = 1, 9 }, false},
		{"the baseline's guide lost", func(l *ActivityLateness) { l.Baseline.Lost, l.Baseline.Guided = 1, 9 }, false},
		{"fewer guided than silent, however counted", func(l *ActivityLateness) { l.Topic.Guided = 9 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := clean
			l := &ActivityLateness{Topic: clean, WebSocket: clean, Baseline: &base, RatioP50: 1.01, RatioP99: 0.99, RatioMax: 1,
				Held: map[string]int{"activity-lag": 25}}
			tc.mutate(l)
			r := &Report{Activity: &Activity{Command: "bin/activitybench", Throughput: throughputs(30000, 55000), Lateness: l}, Errors: map[string]string{}}
			r.judge()
			if r.Passed != tc.pass {
				t.Errorf("passed %v, want %v; lines %q", r.Passed, tc.pass, r.LostOrDoubled)
			}
			crowds := 3
			if l.Baseline == nil {
				crowds = 2
			}
			if len(r.LostOrDoubled) != crowds {
				t.Errorf("%d lost-or-doubled lines, want one per crowd (%d): %q", len(r.LostOrDoubled), crowds, r.LostOrDoubled)
			}
			md := r.markdown()
			for _, want := range []string{"topic-fed, feed on", "WebSocket-fed, feed on", "Topic-fed over WebSocket-fed: 1.01 at p50", "25 timeouts by activity-lag"} {
				if !strings.Contains(md, want) {
					t.Errorf("report lacks %q", want)
				}
			}
			if got := strings.Contains(md, "WebSocket-fed, feed off"); got != (l.Baseline != nil) {
				t.Errorf("report shows the feed-off crowd: %v, want %v", got, l.Baseline != nil)
			}
		})
	}
	// Throughput alone, from an activitybench without the lateness part.
	r := &Report{Activity: &Activity{Throughput: throughputs(30000, 55000)}, Errors: map[string]string{}}
	r.judge()
	if !r.Passed || len(r.LostOrDoubled) != 0 {
		t.Errorf("throughput alone: passed %v, lines %q; want passed, none", r.Passed, r.LostOrDoubled)
	}
}

// throughputs are a run on one redis-server at single, then on a
// cluster of two masters at cluster.
func throughputs(single, cluster float64) []ActivityThroughput {
	one := ActivityThroughput{RedisMasters: 1, EventsPerSecond: single, RedisCores: []float64{0.87}}
	two := ActivityThroughput{RedisMasters: 2, EventsPerSecond: cluster, RedisCores: []float64{0.61, 0.63}}
	return []ActivityThroughput{one, two}
}

// TestActivityThroughputRows: each Redis has its row, judged against the
// goal on its own, the Redis named.
func TestActivityThroughputRows(t *testing.T) {
	r := &Report{Activity: &Activity{Command: "bin/activitybench", Throughput: throughputs(36000, 55000)}, Errors: map[string]string{}}
	r.judge()
	md := r.markdown()
	for _, want := range []string{
		"one gateway, one redis-server | **36000**; Redis 0.0 µs of CPU per event, its thread 0.87 cores busy | at least 50,000 | **missed**",
		"one gateway, Redis Cluster of 2 masters | **55000**; Redis 0.0 µs of CPU per event, its masters' threads 0.61 / 0.63 cores busy | at least 50,000 | met",
		"| Redis Cluster of 2 masters | **55000**",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
