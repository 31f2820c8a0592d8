package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
)

// logTally is a child's stderr: it passes the first few lines through
// and counts every JSON log line by level and message, so a burst of
// warnings becomes one line of the report rather than a flood.
type logTally struct {
	mu      sync.Mutex
	out     io.Writer
	show    int // lines still passed through
	partial []byte
	counts  map[string]int
}

func newLogTally(out io.Writer, show int) *logTally {
	return &logTally{out: out, show: show, counts: map[string]int{}}
}

func (t *logTally) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		line := t.partial[:i+1]
		var rec struct{ Level, Msg string }
		key := "other output"
		if json.Unmarshal(line, &rec) == nil && rec.Msg != "" {
			key = rec.Level + " " + rec.Msg
		}
		t.counts[key]++
		if t.show > 0 {
			t.show--
			t.out.Write(line)
		}
		t.partial = t.partial[i+1:]
	}
	return len(p), nil
}

// summary is "N× LEVEL msg" per kind, most frequent first.
func (t *logTally) summary() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(t.counts), func(a, b string) int { return t.counts[b] - t.counts[a] })
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%d× %s", t.counts[k], k))
	}
	return out
}

// merge adds tallies of several processes into one summary.
func mergeTallies(ts ...*logTally) []string {
	sum := newLogTally(io.Discard, 0)
	for _, t := range ts {
		t.mu.Lock()
		for k, v := range t.counts {
			sum.counts[k] += v
		}
		t.mu.Unlock()
	}
	return sum.summary()
}
