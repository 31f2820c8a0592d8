package main

import (
	"context"
	"testing"
	"time"
)

// TestAttackBusyMedianEvenCount: over an even number of half seconds,
// over's "median" is the upper of the middle two. With two steps it is
// the peak; the report's verdict (median >= 0.9: "bound by the cores")
// then follows the busier half of the release.
func TestAttackBusyMedianEvenCount(t *testing.T) {
	from := time.Unix(1000, 0)
	step := 500 * time.Millisecond
	at := func(k int) time.Time { return from.Add(time.Duration(k)*step + step/2) }
	for _, tc := range []struct {
		name string
		busy map[int]float64
		want float64
	}{
		{"two steps", map[int]float64{0: 0.4, 1: 0.95}, 0.675},
		{"four steps", map[int]float64{0: 0.85, 1: 0.86, 2: 0.93, 3: 0.95}, 0.895},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := busySteps{from: from, step: step, busy: tc.busy}
			median, peak, ok := s.over(at(0), at(len(tc.busy)-1))
			if !ok || median-tc.want > 1e-9 || tc.want-median > 1e-9 {
				t.Errorf("over = median %v (peak %v, %v); the median of %v is %v", median, peak, ok, tc.busy, tc.want)
			}
			if tc.want < 0.9 && median >= 0.9 {
				t.Errorf("a median of %v reads as bound by the cores (>= 0.9)", median)
			}
		})
	}
}

// TestAttackSampleBusyCatchUp: a sampler that falls behind (its timer
// fires after the ends of several steps) reads the machine back to back
// for every step it missed and records readings of a few microseconds
// (0 or 1 tick: 0% or 100%) as whole steps it never watched. Here the
// steps before the sampler started stand for the missed ones.
func TestAttackSampleBusyCatchUp(t *testing.T) {
	step := time.Millisecond
	started := time.Now()
	from := started.Add(-5 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	s := sampleBusy(ctx, from, from, step)
	missed := s.index(started) // steps 0..missed-1 ended before it began
	n := 0
	for k, v := range s.busy {
		if k < missed {
			n++
			if n <= 3 {
				t.Errorf("step %d (ended %v before the sampler started) read as %.0f%% busy", k, started.Sub(from.Add(time.Duration(k+1)*step)), 100*v)
			}
		}
	}
	if n > 0 {
		t.Errorf("%d steps the sampler never watched have readings", n)
	}
}
