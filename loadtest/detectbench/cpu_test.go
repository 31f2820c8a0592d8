package main

import (
	"math"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		name        string
		in          string
		busy, total uint64
		ok          bool
	}{
		{"ten fields", "cpu  100 5 50 800 20 3 2 1 7 0\ncpu0 1 2 3\n", 161, 981, true},
		{"four numbers, no iowait", "cpu 1 2 3 4\n", 6, 10, true},
		{"three numbers", "cpu 1 2 3\n", 0, 0, false},
		{"five numbers", "cpu 1 2 3 4 5\n", 6, 15, true},
		{"not the cpu line", "intr 1 2 3 4 5\n", 0, 0, false},
		{"not a number", "cpu 1 x 3 4 5\n", 0, 0, false},
		{"empty", "", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			busy, total, ok := parseProcStat(tc.in)
			if busy != tc.busy || total != tc.total || ok != tc.ok {
				t.Errorf("parseProcStat(%q) = %d, %d, %v; want %d, %d, %v", tc.in, busy, total, ok, tc.busy, tc.total, tc.ok)
			}
		})
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add("cpu  100 5 50 800 20 3 2 1 7 0\n")
	f.Add("cpu 1 2 3 4\n")
	f.Fuzz(func(t *testing.T, s string) {
		busy, total, ok := parseProcStat(s)
		if ok && busy > total {
			t.Errorf("busy %d > total %d for %q", busy, total, s)
		}
		if !ok && (busy != 0 || total != 0) {
			t.Errorf("not ok, yet %d, %d", busy, total)
		}
	})
}

func TestBusyStepsOver(t *testing.T) {
	from := time.Unix(1000, 0)
	s := busySteps{from: from, step: 500 * time.Millisecond, busy: map[int]float64{
		-3: 0.99,                            // before the phase: not counted
		18: 0.5, 19: 0.9, 20: 0.8, 22: 0.95, // 21 not read
		24: 1, // after it
	}}
	at := func(ms int) time.Time { return from.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name         string
		a, b         time.Time
		median, peak float64
		ok           bool
	}{
		{"the steps from a's to b's", at(9200), at(11300), 0.85, 0.95, true},
		{"an odd count", at(9600), at(11300), 0.9, 0.95, true},
		{"one step", at(9600), at(9900), 0.9, 0.9, true},
		{"a step not read", at(10500), at(10900), 0, 0, false},
		{"before the origin", at(-1400), at(-1100), 0.99, 0.99, true},
		{"nothing read", at(30000), at(31000), 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			median, peak, ok := s.over(tc.a, tc.b)
			if math.Abs(median-tc.median) > 1e-9 || peak != tc.peak || ok != tc.ok {
				t.Errorf("over = %v, %v, %v; want %v, %v, %v", median, peak, ok, tc.median, tc.peak, tc.ok)
			}
		})
	}
}
