package main

import (
	"strings"
	"testing"
)

func TestStormCPU(t *testing.T) {
	base := Storm{Held: 40000, ReleaseMs: 3600, ReleaseSelfCPUS: 5.0, RedisReleaseCPUS: 2.2, Cores: 2}
	for _, tc := range []struct {
		name string
		edit func(*Storm)
		want []string // each must appear; none: the line is empty
	}{
		{"bound by the cores", func(s *Storm) { s.ReleaseMachineBusy = 0.97 },
			[]string{"180 µs per held timeout", "97% busy", "bound by the cores", "3.6 s of 2 cores", "at most 100 µs each"}},
		{"cores idle", func(s *Storm) { s.ReleaseMachineBusy = 0.6 },
			[]string{"60% busy", "not saturated", "40% of the cores idle"}},
		{"bound by the cores in its half seconds", func(s *Storm) {
			s.ReleaseMachineBusy, s.ReleaseBusyMedian, s.ReleaseBusyPeak = 0.8, 0.92, 0.97
		}, []string{"80% busy", "92% busy at the median and 97% at the peak", "bound by the cores"}},
		{"idle in its half seconds", func(s *Storm) {
			s.ReleaseMachineBusy, s.ReleaseBusyMedian, s.ReleaseBusyPeak = 0.8, 0.7, 0.75
		}, []string{"70% busy at the median", "not saturated", "30% of the cores idle"}},
		{"machine unknown", func(s *Storm) { s.ReleaseMachineBusy = -1 }, nil},
		{"nothing held", func(s *Storm) { s.Held, s.ReleaseMachineBusy = 0, 0.9 }, nil},
		{"not measured", func(s *Storm) { s.ReleaseMs, s.ReleaseMachineBusy = 0, 0.9 }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			tc.edit(&s)
			got := stormCPU(&s)
			if len(tc.want) == 0 {
				if got != "" {
					t.Fatalf("stormCPU = %q, want none", got)
				}
				return
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("stormCPU = %q, want it to say %q", got, w)
				}
			}
		})
	}
}
