package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuUse is a snapshot of CPU spent so far: this process's (user and
// system) and the whole machine's busy and total time (/proc/stat's first
// line, in clock ticks). Two snapshots say whether a phase was bound by
// the machine's cores: the storm's release runs the listener, the Kafka
// broker, the consumer and the webhook in this process, beside Redis.
type cpuUse struct {
	self        time.Duration
	busy, total uint64
	ok          bool // the machine's figures were read
}

func readCPUUse() cpuUse {
	var u cpuUse
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		u.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		u.busy, u.total, u.ok = parseProcStat(string(b))
	}
	return u
}

// parseProcStat reads the machine's CPU ticks from /proc/stat's "cpu"
// line: busy is every field but idle and iowait (the 4th and 5th).
func parseProcStat(s string) (busy, total uint64, ok bool) {
	line, _, _ := strings.Cut(s, "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, false
	}
	for i, f := range fields[1:] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		// guest and guest_nice (9th, 10th) are counted in user already.
		if i >= 8 {
			break
		}
		total += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, total, true
}

// cpuSpent is what was spent between two snapshots: this process's CPU
// and the share of the machine's cores that were busy (0 to 1; -1 when
// unknown).
func (u cpuUse) since(before cpuUse) (self time.Duration, machineBusy float64) {
	self = u.self - before.self
	if !u.ok || !before.ok || u.total <= before.total {
		return self, -1
	}
	return self, float64(u.busy-before.busy) / float64(u.total-before.total)
}

func (u cpuUse) String() string {
	return fmt.Sprintf("self %v, busy %d of %d ticks", u.self, u.busy, u.total)
}
