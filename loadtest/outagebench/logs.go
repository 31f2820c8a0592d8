package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"
)

// tally takes the JSON log lines of every service of the run, the
// gateways' stderr and the in-process listener's and consumer's, and
// keeps each one's time and kind (service, level, message), so that the
// report can say what each service logged during each fault. The first
// few lines of each kind at WARN or above pass through to out.
type tally struct {
	mu    sync.Mutex
	out   io.Writer
	shown map[string]int
	lines []logLine
}

type logLine struct {
	at   time.Time
	kind string
}

// showEach is how many lines of one kind pass through.
const showEach = 2

// maxLines bounds what one run keeps; a service that floods its log is
// itself a finding, and the first lines tell it.
const maxLines = 200000

func newTally(out io.Writer) *tally { return &tally{out: out, shown: map[string]int{}} }

// writer is an io.Writer of one service's lines.
func (t *tally) writer(service string) io.Writer { return &tallyWriter{t: t, service: service} }

type tallyWriter struct {
	t       *tally
	service string
	partial []byte
}

func (w *tallyWriter) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.t.add(w.service, w.partial[:i+1])
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

func (t *tally) add(service string, line []byte) {
	var rec struct{ Level, Msg string }
	kind := service + " other output"
	if json.Unmarshal(line, &rec) == nil && rec.Msg != "" {
		kind = service + " " + rec.Level + " " + rec.Msg
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) < maxLines {
		t.lines = append(t.lines, logLine{at: time.Now(), kind: kind})
	}
	if rec.Level != "INFO" && rec.Level != "DEBUG" && t.shown[kind] < showEach {
		t.shown[kind]++
		fmt.Fprintf(t.out, "%s: %s", service, line)
	}
}

// between is "N× kind" for the lines logged in [from, to), most frequent
// first.
func (t *tally) between(from, to time.Time) []string {
	t.mu.Lock()
	counts := map[string]int{}
	for _, l := range t.lines {
		if !l.at.Before(from) && l.at.Before(to) {
			counts[l.kind]++
		}
	}
	t.mu.Unlock()
	kinds := slices.SortedFunc(maps.Keys(counts), func(a, b string) int {
		if counts[a] != counts[b] {
			return counts[b] - counts[a]
		}
		if a < b {
			return -1
		}
		return 1
	})
	var out []string
	for _, k := range kinds {
		out = append(out, fmt.Sprintf("%d× %s", counts[k], k))
	}
	return out
}
