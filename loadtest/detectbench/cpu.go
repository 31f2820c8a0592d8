package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
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

// busySteps is how busy the machine's cores were in each step of time
// from an origin (the storm's window's end): an average over a phase
// hides whether its busiest part was bound by the cores (a release whose
// holds fall due over its first half second, and whose last guides are
// the consumer's alone).
type busySteps struct {
	from time.Time
	step time.Duration
	busy map[int]float64 // by step index: floor((t-from)/step)
}

// sampleBusy reads the machine's CPU at the end of each step from the
// one start falls in until ctx is done, and returns what it read. It runs
// on a goroutine of its own.
func sampleBusy(ctx context.Context, from, start time.Time, step time.Duration) busySteps {
	s := busySteps{from: from, step: step, busy: map[int]float64{}}
	k := s.index(start)
	if !sleepCtx(ctx, time.Until(from.Add(time.Duration(k)*step))) {
		return s
	}
	prev := readCPUUse()
	for {
		end := from.Add(time.Duration(k+1) * step)
		if !sleepCtx(ctx, time.Until(end)) {
			return s
		}
		cur := readCPUUse()
		if now := s.index(time.Now()); now > k+1 {
			// Woken a step or more late: the reading spans steps, and
			// is no one step's. The steps it spans are not read; the
			// next is, from now.
			k, prev = now, cur
			continue
		}
		if _, busy := cur.since(prev); busy >= 0 {
			s.busy[k] = busy
		}
		prev = cur
		k++
	}
}

// index is the step t falls in.
func (s busySteps) index(t time.Time) int {
	return int(math.Floor(float64(t.Sub(s.from)) / float64(s.step)))
}

// over returns the median and the peak of the steps measured from the
// one a falls in to the one b falls in; ok is false when none was.
func (s busySteps) over(a, b time.Time) (median, peak float64, ok bool) {
	var got []float64
	for k := s.index(a); k <= s.index(b); k++ {
		if v, in := s.busy[k]; in {
			got = append(got, v)
		}
	}
	if len(got) == 0 {
		return 0, 0, false
	}
	slices.Sort(got)
	median = got[len(got)/2]
	if len(got)%2 == 0 {
		median = (got[len(got)/2-1] + median) / 2
	}
	return median, got[len(got)-1], true
}
