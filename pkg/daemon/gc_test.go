package daemon

import (
	"errors"
	"io/fs"
	"runtime/debug"
	"strings"
	"testing"
)

func TestGCSettings(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name           string
		gogc, memlimit string
		container      int64
		percent        int
		limit          int64
	}{
		{"nothing set, no container limit", "", "", 0, 200, 0},
		{"nothing set, a 1 GiB container", "", "", gib, 200, gib * 9 / 10},
		{"GOGC set: its percent stays", "400", "", gib, 0, gib * 9 / 10},
		{"GOGC=off stays", "off", "", gib, 0, gib * 9 / 10},
		{"GOMEMLIMIT set: its limit stays", "", "500MiB", gib, 200, 0},
		{"both set", "100", "500MiB", gib, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := gcSettings(200, tc.gogc, tc.memlimit, tc.container)
			if got.percent != tc.percent || got.limit != tc.limit {
				t.Fatalf("gcSettings = percent %d, limit %d; want %d, %d", got.percent, got.limit, tc.percent, tc.limit)
			}
		})
	}
}

func TestParseMemoryLimit(t *testing.T) {
	for in, want := range map[string]int64{
		"536870912\n":           536870912,
		"1073741824":            1 << 30,
		"max\n":                 0, // cgroup v2: none
		"9223372036854771712\n": 0, // cgroup v1: none
		"":                      0,
		"-1":                    0,
		"0":                     0,
		"12k":                   0,
		"99999999999999999999":  0,
	} {
		if got := parseMemoryLimit([]byte(in)); got != want {
			t.Errorf("parseMemoryLimit(%q) = %d, want %d", in, got, want)
		}
	}
}

func FuzzParseMemoryLimit(f *testing.F) {
	for _, s := range []string{"536870912\n", "max\n", "9223372036854771712", "-5", " 42 ", "1e9"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n := parseMemoryLimit(b)
		if n < 0 || n >= noLimitFloor {
			t.Fatalf("parseMemoryLimit(%q) = %d: a limit is positive and below %d, or 0", b, n, int64(noLimitFloor))
		}
		if n > 0 && strings.TrimSpace(string(b)) == "max" {
			t.Fatalf("parseMemoryLimit(%q) = %d, want 0", b, n)
		}
	})
}

func TestContainerMemoryLimit(t *testing.T) {
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(name string) ([]byte, error) {
			if s, ok := m[name]; ok {
				return []byte(s), nil
			}
			return nil, fs.ErrNotExist
		}
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
	}{
		{"cgroup v2", map[string]string{cgroupMemoryFiles[0]: "268435456\n"}, 256 << 20},
		{"cgroup v2 without a limit", map[string]string{cgroupMemoryFiles[0]: "max\n", cgroupMemoryFiles[1]: "1024"}, 0},
		{"cgroup v1", map[string]string{cgroupMemoryFiles[1]: "536870912\n"}, 512 << 20},
		{"no cgroup", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := containerMemoryLimit(files(tc.files)); got != tc.want {
				t.Fatalf("containerMemoryLimit = %d, want %d", got, tc.want)
			}
		})
	}
	if got := containerMemoryLimit(func(string) ([]byte, error) { return nil, errors.New("denied") }); got != 0 {
		t.Fatalf("unreadable files: %d, want 0", got)
	}
}

// TestTuneGC: the process's collector takes the service's goal, and
// keeps GOGC's when it is set.
func TestTuneGC(t *testing.T) {
	before, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(before); debug.SetMemoryLimit(limit) })
	t.Setenv("GOGC", "")
	if gogc, _ := TuneGC(173); gogc != 173 {
		t.Fatalf("TuneGC(173) says GOGC=%d", gogc)
	}
	if got := debug.SetGCPercent(100); got != 173 {
		t.Fatalf("GC percent %d after TuneGC(173), want 173", got)
	}
	t.Setenv("GOGC", "100")
	if gogc, _ := TuneGC(173); gogc != 100 {
		t.Fatalf("TuneGC with GOGC=100 set says GOGC=%d", gogc)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GC percent %d after TuneGC with GOGC=100 set, want 100", got)
	}
}
