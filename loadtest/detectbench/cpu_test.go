package main

import "testing"

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
