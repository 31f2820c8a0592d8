package main

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/loadtest/latency"
)

func TestParseResult(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string
		want loadResult
	}{
		{"the line before ping→pong figures",
			"RESULT conns=14286 failed=1 dropped=2 closed=3 pings=63000 pongs=62999 guides=150 guide_ids=149",
			loadResult{Conns: 14286, Failed: 1, Dropped: 2, Closed: 3, Pings: 63000, Pongs: 62999, Guides: 150, GuideIDs: 149}},
		{"with ping→pong figures",
			"RESULT conns=10 failed=0 dropped=0 closed=0 pings=40 pongs=40 guides=0 guide_ids=0 pong_n=40 pong_p50_ms=2.111 pong_p99_ms=30.5 pong_p999_ms=31 pong_max_ms=31.999 pong_hist=",
			loadResult{Conns: 10, Pings: 40, Pongs: 40, pongFigures: pongFigures{PongN: 40, PongP50ms: 2.111, PongP99ms: 30.5, PongP999ms: 31, PongMaxms: 31.999}}},
		{"unknown fields and bad figures",
			"RESULT conns=5 later_field=7 pings=x pong_p99_ms=?? =3 bare",
			loadResult{Conns: 5}},
		{"empty", "RESULT ", loadResult{}},
		{"a ramping line reads alike", "ramping conns=1200 failed=3", loadResult{Conns: 1200, Failed: 3}},
		{"a mark line reads alike", "mark pong_n=7 pong_p99_ms=1.5", loadResult{pongFigures: pongFigures{PongN: 7, PongP99ms: 1.5}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseResult(tc.line)
			got.hist = nil
			if got != tc.want {
				t.Errorf("parseResult(%q)\n got %+v\nwant %+v", tc.line, got, tc.want)
			}
		})
	}
}

func TestResultsMergeHistograms(t *testing.T) {
	// Two processes: one saw 99 fast pongs, the other 1 slow one. The
	// sum's p99 is of all 100 samples, not the worse process's p99.
	var fast, slow latency.Histogram
	for range 99 {
		fast.Record(2 * time.Millisecond)
	}
	slow.Record(500 * time.Millisecond)
	a := parseResult("RESULT conns=1 pong_n=99 pong_p99_ms=2 pong_hist=" + fast.String())
	b := parseResult("RESULT conns=1 pong_n=1 pong_p99_ms=500 pong_hist=" + slow.String())
	var sum loadResult
	sum.add(a)
	sum.add(b)
	if sum.PongN != 100 || sum.Conns != 2 {
		t.Fatalf("sum %+v, want 100 pongs of 2 connections", sum)
	}
	if sum.PongP99ms < 2 || sum.PongP99ms > 2.1 {
		t.Errorf("p99 of the sum %v ms, want 2 ms (99 of 100 samples)", sum.PongP99ms)
	}
	if sum.PongMaxms < 500 || sum.PongMaxms > 508 {
		t.Errorf("max of the sum %v ms, want 500 ms", sum.PongMaxms)
	}

	// Without histograms, the worst process's figures.
	var old loadResult
	old.add(parseResult("RESULT pong_p50_ms=1 pong_p99_ms=9"))
	old.add(parseResult("RESULT pong_p50_ms=3 pong_p99_ms=4"))
	if old.PongP50ms != 3 || old.PongP99ms != 9 {
		t.Errorf("summed without histograms: p50 %v, p99 %v; want 3 and 9", old.PongP50ms, old.PongP99ms)
	}
}
