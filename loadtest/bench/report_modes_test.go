package main

import (
	"strings"
	"testing"
)

func TestModesGoals(t *testing.T) {
	// goroutine mode: 100 ms of CPU per 1,000 pings, p99 20 ms, 0.2 round
	// trips per renewal; epoll mode varies around it.
	pair := func(cpu, p99, trips float64) *Modes {
		return &Modes{Supported: true, Modes: []ModeResult{
			{Mode: "epoll", CPUmsPer1000: cpu, Renewals: 1000, TripsPerRen: trips, Pong: pongFigures{PongN: 100, PongP99ms: p99}},
			{Mode: "goroutine", CPUmsPer1000: 100, Renewals: 1000, TripsPerRen: 0.2, Pong: pongFigures{PongN: 100, PongP99ms: 20}},
		}}
	}
	for _, tc := range []struct {
		name      string
		m         *Modes
		quick     bool
		cpu, p99  string
		roundTrip string
	}{
		{"all met", pair(115, 20, 0.2), false, "met", "met", "met"},
		{"all missed", pair(116, 20.1, 0.21), false, "**missed**", "**missed**", "**missed**"},
		{"better than goroutine mode", pair(80, 5, 0.1), false, "met", "met", "met"},
		{"judged in quick mode too", pair(200, 5, 0.1), true, "**missed**", "met", "met"},
		{"a gateway without the setting", func() *Modes { m := pair(80, 5, 0.1); m.Supported = false; return m }(), false,
			"n/a", "n/a", "n/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Report{Quick: tc.quick}
			goals := r.modesGoals(tc.m)
			if len(goals) != 4 {
				t.Fatalf("%d rows, want 4", len(goals))
			}
			for i, want := range []string{tc.cpu, tc.p99, tc.roundTrip} {
				if got := goals[i+1].status; !strings.HasPrefix(got, want) {
					t.Errorf("%s: %q, want %q", goals[i+1].figure, got, want)
				}
			}
		})
	}
	if g := (&Report{}).modesGoals(&Modes{Modes: []ModeResult{{Mode: "epoll"}}}); g != nil {
		t.Errorf("rows %v from one mode, want none", g)
	}
}

func TestModesGoalsByParts(t *testing.T) {
	// Over the whole window epoll mode is a little worse on both
	// figures; its parts decide.
	withParts := func(e, g []float64) *Modes {
		m := &Modes{Supported: true, Modes: []ModeResult{
			{Mode: "epoll", CPUmsPer1000: 100, Renewals: 1000, TripsPerRen: 0.21, Pong: pongFigures{PongN: 100, PongP99ms: 21}},
			{Mode: "goroutine", CPUmsPer1000: 100, Renewals: 1000, TripsPerRen: 0.2, Pong: pongFigures{PongN: 100, PongP99ms: 20}},
		}}
		for i, v := range e {
			m.Modes[0].Parts = append(m.Modes[0].Parts, modePart{Pong: pongFigures{PongP99ms: v}, TripsPerRen: v / 100})
			m.Modes[1].Parts = append(m.Modes[1].Parts, modePart{Pong: pongFigures{PongP99ms: g[i]}, TripsPerRen: g[i] / 100})
		}
		return m
	}
	for _, tc := range []struct {
		name string
		e, g []float64
		want string
		says string
	}{
		{"one part's hiccup", []float64{10, 10, 40, 10, 10}, []float64{11, 11, 11, 11, 11}, "met", "no worse in 4 of 5 parts"},
		{"worse in most parts", []float64{12, 12, 12, 10, 10}, []float64{11, 11, 11, 11, 11}, "**missed**", "no worse in 2 of 5 parts"},
		{"a tie counts as no worse", []float64{11, 11, 11, 12, 12}, []float64{11, 11, 11, 11, 11}, "met", "no worse in 3 of 5 parts"},
		{"half is not most", []float64{10, 12}, []float64{11, 11}, "**missed**", "no worse in 1 of 2 parts"},
		{"no parts: the whole decides", nil, nil, "**missed**", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goals := (&Report{}).modesGoals(withParts(tc.e, tc.g))
			for _, row := range goals[2:] {
				if !strings.HasPrefix(row.status, tc.want) {
					t.Errorf("%s: %q, want %q", row.figure, row.status, tc.want)
				}
				if tc.says != "" && !strings.Contains(row.measured, tc.says) {
					t.Errorf("%s: %q, want it to say %q", row.figure, row.measured, tc.says)
				}
			}
		})
	}
}

// TestConnectionsSummary: step 1 carries the RSS goal (its connections
// ping every 15 s, the goal's conditions), step 1b the held goal; step 1
// carries the held goal too when it was set to the goal's count.
func TestConnectionsSummary(t *testing.T) {
	for _, tc := range []struct {
		name           string
		c              Connections
		heldGoal, held bool // the held row has a goal; it was met
		rssGoal, rss   bool
	}{
		{"1b: 250k in epoll mode", Connections{Step: "1b", ReadMode: "epoll", Target: 250000, Held: 250000, RSSPerConnKB: 3.9}, true, true, false, false},
		{"1b: one dropped", Connections{Step: "1b", ReadMode: "epoll", Target: 250000, Held: 250000, RSSPerConnKB: 3.9, Load: loadResult{Dropped: 1}}, true, false, false, false},
		{"1b: one failed", Connections{Step: "1b", ReadMode: "epoll", Target: 250000, Held: 250000, RSSPerConnKB: 3.9, Load: loadResult{Failed: 1}}, true, false, false, false},
		{"1b: most shed", Connections{Step: "1b", ReadMode: "epoll", Target: 250000, Held: 78, RSSPerConnKB: 15940}, true, false, false, false},
		{"1: 100k in epoll mode, 3.9 KB", Connections{Step: "1", ReadMode: "epoll", Target: 100000, Held: 100000, RSSPerConnKB: 3.9}, false, false, true, true},
		{"1: goroutine mode", Connections{Step: "1", ReadMode: "goroutine", Target: 100000, Held: 100000, RSSPerConnKB: 3.9}, false, false, true, false},
		{"1: too few for the memory goal", Connections{Step: "1", ReadMode: "epoll", Target: 100000, Held: 99999, RSSPerConnKB: 3.9}, false, false, true, false},
		{"1: over 4 KB", Connections{Step: "1", ReadMode: "epoll", Target: 120000, Held: 120000, RSSPerConnKB: 4.01}, false, false, true, false},
		{"1: set to 250k", Connections{Step: "1", ReadMode: "epoll", Target: 250000, Held: 250000, RSSPerConnKB: 3.9}, true, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := tc.c.summary()
			if (rows[0].goal != "") != tc.heldGoal || (rows[1].goal != "") != tc.rssGoal {
				t.Fatalf("held row goal %q, RSS row goal %q; want a goal: %v, %v", rows[0].goal, rows[1].goal, tc.heldGoal, tc.rssGoal)
			}
			if rows[0].met != tc.held || rows[1].met != tc.rss {
				t.Errorf("held met %v, RSS met %v; want %v, %v", rows[0].met, rows[1].met, tc.held, tc.rss)
			}
			if strings.HasPrefix(rows[1].measured, "not measured") != (tc.c.Held < float64(tc.c.Target)/2) {
				t.Errorf("RSS row %q with %.0f of %d held", rows[1].measured, tc.c.Held, tc.c.Target)
			}
			if rows[0].atScale != tc.heldGoal || rows[1].atScale != tc.rssGoal || rows[2].goal != "" || rows[3].goal != "" {
				t.Errorf("rows %+v: a goal is judged at full scale only, the other rows have none", rows)
			}
		})
	}
}

func TestModesMarkdown(t *testing.T) {
	m := &Modes{Supported: true, Command: "bin/bench -steps modes", Conns: 15000, PingEvery: "15s", IdleClean: true, WindowSec: 30,
		Modes: []ModeResult{
			{Mode: "epoll", Gateway: "bench-mode-epoll", IdleRSSPerConn: 3.5, RSSPerConn: 3.9, CPUmsPer1000: 100, Renewals: 1, TripsPerRen: 0.2, Pong: pongFigures{PongN: 1, PongP99ms: 10}},
			{Mode: "goroutine", Gateway: "bench-mode-goroutine", IdleRSSPerConn: 11, RSSPerConn: 17, CPUmsPer1000: 100, Renewals: 1, TripsPerRen: 0.2, Pong: pongFigures{PongN: 1, PongP99ms: 10}},
		}}
	r := &Report{Modes: m, Errors: map[string]string{}}
	md := r.markdown()
	for _, want := range []string{
		"## 7. Read modes side by side",
		"| | epoll (bench-mode-epoll) | goroutine (bench-mode-goroutine) |",
		"| **RSS per connection, idle** | **3.50 KB** | **11.00 KB** |",
		"| 7 | gateway CPU per 1,000 pings: epoll vs goroutine | **100 ms** vs 100 ms (100%) | at most 115% of goroutine mode's | met |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(md, "no read mode setting") {
		t.Error("report says the gateway has no read mode setting, but it has")
	}
}
