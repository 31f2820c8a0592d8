package daemon

import (
	"bytes"
	"os"
	"runtime/debug"
	"strconv"
)

// memoryLimitShare is the share of its container's memory limit a
// service's Go heap may use before the collector works harder to stay
// under it: the rest is for goroutine stacks, the runtime's own data and
// what the kernel counts against the container besides (socket buffers).
const memoryLimitShare = 0.9

// cgroupMemoryFiles hold the container's memory limit: cgroup v2's, then
// v1's.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// TuneGC sets the process's garbage collector for a service: its goal
// to percent, as GOGC would, unless GOGC is set; and a soft memory
// limit of 90% of its container's memory limit, as GOMEMLIMIT would,
// unless GOMEMLIMIT is set or the container has no limit. A larger goal
// spends less CPU on collection for a larger heap; the limit makes the
// collector work harder near the container's limit instead of letting
// the heap grow into it and the container be killed. It returns the
// settings in force after it, for the service's log: the goal (-1: off)
// and the limit in bytes (math.MaxInt64: none).
func TuneGC(percent int) (gogc int, memoryLimit int64) {
	set := gcSettings(percent, os.Getenv("GOGC"), os.Getenv("GOMEMLIMIT"), containerMemoryLimit(os.ReadFile))
	if set.percent != 0 {
		debug.SetGCPercent(set.percent)
	}
	if set.limit > 0 {
		debug.SetMemoryLimit(set.limit)
	}
	gogc = debug.SetGCPercent(100)
	debug.SetGCPercent(gogc)
	return gogc, debug.SetMemoryLimit(-1)
}

// gcTuning is what TuneGC sets: 0 leaves a setting as the runtime has it.
type gcTuning struct {
	percent int
	limit   int64 // bytes
}

// gcSettings decides TuneGC's settings from the environment's GOGC and
// GOMEMLIMIT and the container's memory limit (0: none).
func gcSettings(percent int, gogc, gomemlimit string, container int64) gcTuning {
	var t gcTuning
	if gogc == "" {
		t.percent = percent
	}
	if gomemlimit == "" && container > 0 {
		t.limit = int64(float64(container) * memoryLimitShare)
	}
	return t
}

// containerMemoryLimit is the container's memory limit in bytes, read
// with read from the first of cgroupMemoryFiles that it can read, or 0
// when there is none.
func containerMemoryLimit(read func(string) ([]byte, error)) int64 {
	for _, f := range cgroupMemoryFiles {
		b, err := read(f)
		if err != nil {
			continue
		}
		return parseMemoryLimit(b)
	}
	return 0
}

// noLimitFloor: cgroup v1 writes "no limit" as the largest multiple of
// the page size that fits an int64; any limit this large is none.
const noLimitFloor = 1 << 60

// parseMemoryLimit reads a cgroup memory limit file: bytes, or "max" (v2)
// or a huge number (v1) for none, which is 0, as is anything else.
func parseMemoryLimit(b []byte) int64 {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil || n <= 0 || n >= noLimitFloor {
		return 0
	}
	return n
}
