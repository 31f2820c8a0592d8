package outage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// recorder is a slog handler that keeps every record it is given.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

var _ slog.Handler = (*recorder)(nil)

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// lines returns each record as "LEVEL message".
func (r *recorder) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.recs))
	for i, rec := range r.recs {
		out[i] = rec.Level.String() + " " + rec.Message
	}
	return out
}

// attrs returns record i's attributes by key.
func (r *recorder) attrs(i int) map[string]slog.Value {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]slog.Value)
	r.recs[i].Attrs(func(a slog.Attr) bool {
		out[a.Key] = a.Value
		return true
	})
	return out
}

func newTestLog(every time.Duration) (*Log, *recorder) {
	rec := &recorder{}
	return NewLog(slog.New(rec), "renew sessions", every), rec
}

// advance moves a synctest bubble's fake clock on by d: every test that
// calls it (or failFor) runs in one, so no real time passes.
func advance(d time.Duration) { time.Sleep(d) }

// failFor reports a failure every step for d, the first at once.
func failFor(l *Log, d, step time.Duration) {
	for t := time.Duration(0); t <= d; t += step {
		if t > 0 {
			advance(step)
		}
		l.Fail(fmt.Errorf("failure at %v", t))
	}
}

const (
	start     = "WARN renew sessions failing"
	summary   = "WARN renew sessions still failing"
	recovered = "INFO renew sessions recovered"
)

func TestLogLines(t *testing.T) {
	tests := []struct {
		name  string
		every time.Duration
		run   func(l *Log)
		want  []string
	}{
		{
			name: "1000 failures in a second: one start line",
			run:  func(l *Log) { failFor(l, 999*time.Millisecond, time.Millisecond) },
			want: []string{start},
		},
		{
			name:  "95 s of failures every 30 s: start and three summaries",
			every: 30 * time.Second,
			run:   func(l *Log) { failFor(l, 95*time.Second, time.Second) },
			want:  []string{start, summary, summary, summary},
		},
		{
			name: "zero interval means 30 s",
			run:  func(l *Log) { failFor(l, 95*time.Second, time.Second) },
			want: []string{start, summary, summary, summary},
		},
		{
			name: "OK after failures: one end line",
			run: func(l *Log) {
				failFor(l, time.Second, 10*time.Millisecond)
				l.OK()
				l.OK()
			},
			want: []string{start, recovered},
		},
		{
			name:  "flapping: one start and one end line per interval",
			every: 30 * time.Second,
			run: func(l *Log) {
				for range 100 {
					l.Fail(errors.New("one master of three down"))
					advance(10 * time.Millisecond)
					l.OK()
				}
				advance(30 * time.Second)
				l.Fail(errors.New("down again"))
				l.OK()
			},
			want: []string{start, recovered, start, recovered},
		},
		{
			name:  "a long relapse is logged once it lasts an interval",
			every: 30 * time.Second,
			run: func(l *Log) {
				l.Fail(errors.New("down"))
				l.OK()
				failFor(l, 45*time.Second, time.Second)
				l.OK()
			},
			want: []string{start, recovered, summary, recovered},
		},
		{
			name: "OK when not failing: nothing",
			run: func(l *Log) {
				for range 1000 {
					l.OK()
				}
			},
		},
		{
			name:  "a new outage after recovery starts again",
			every: 30 * time.Second,
			run: func(l *Log) {
				failFor(l, 20*time.Second, time.Second)
				l.OK()
				advance(time.Minute)
				failFor(l, 20*time.Second, time.Second)
				l.OK()
			},
			want: []string{start, recovered, start, recovered},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, rec := newTestLog(tt.every)
				tt.run(l)
				got := rec.lines()
				if len(got) != len(tt.want) {
					t.Fatalf("logged %d lines %q, want %d %q", len(got), got, len(tt.want), tt.want)
				}
				for i := range got {
					if got[i] != tt.want[i] {
						t.Errorf("line %d: %q, want %q", i, got[i], tt.want[i])
					}
				}
			})
		})
	}
}

// TestLogAttrs: the summaries count the failures since the line before,
// and the end line says how long it lasted and how often it failed.
func TestLogAttrs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, rec := newTestLog(30 * time.Second)
		t0 := time.Now()
		failFor(l, 95*time.Second, time.Second) // failures at 0, 1, ..., 95 s
		advance(5 * time.Second)
		l.OK()

		if len(rec.lines()) != 5 {
			t.Fatalf("lines %q, want start, 3 summaries, end", rec.lines())
		}
		if got := rec.attrs(0)[keyErr].Any().(error).Error(); got != "failure at 0s" {
			t.Errorf("start line err %q, want the first failure", got)
		}
		for i, want := range []struct{ failures, total int64 }{{30, 31}, {30, 61}, {30, 91}} {
			a := rec.attrs(1 + i)
			if a[keyFailures].Int64() != want.failures || a[keyTotal].Int64() != want.total {
				t.Errorf("summary %d: failures %v total %v, want %d and %d",
					i, a[keyFailures], a[keyTotal], want.failures, want.total)
			}
			if !a[keySince].Time().Equal(t0) {
				t.Errorf("summary %d: since %v, want %v", i, a[keySince].Time(), t0)
			}
		}
		end := rec.attrs(4)
		if end[keyFor].Duration() != 100*time.Second || end[keyTotal].Int64() != 96 {
			t.Errorf("end line: for %v total %v, want 1m40s and 96", end[keyFor], end[keyTotal])
		}
		if got := end[keyErr].Any().(error).Error(); got != "failure at 1m35s" {
			t.Errorf("end line err %q, want the last failure", got)
		}
	})
}

func TestFailing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := newTestLog(0)
		if _, failing := l.Failing(); failing {
			t.Fatal("failing before any failure")
		}
		t0 := time.Now()
		l.Fail(errors.New("down"))
		advance(time.Second)
		l.Fail(errors.New("down"))
		if since, failing := l.Failing(); !failing || !since.Equal(t0) {
			t.Errorf("Failing() = %v, %v; want %v, true", since, failing, t0)
		}
		l.OK()
		if _, failing := l.Failing(); failing {
			t.Error("failing after OK")
		}
	})
}

// TestLogConcurrent: many goroutines failing and recovering at once still
// log whole outages, each a start line and then an end line.
func TestLogConcurrent(t *testing.T) {
	l, rec := newTestLog(time.Hour)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 1000 {
				if (g+i)%7 == 0 {
					l.OK()
				} else {
					l.Fail(errors.New("down"))
				}
				l.Failing()
			}
		})
	}
	wg.Wait()
	l.OK()
	lines := rec.lines()
	for i, line := range lines {
		want := start
		if i%2 == 1 {
			want = recovered
		}
		if line != want {
			t.Fatalf("line %d: %q, want %q (%d lines)", i, line, want, len(lines))
		}
	}
	if len(lines)%2 != 0 {
		t.Errorf("%d lines: an outage has no end", len(lines))
	}
}

func BenchmarkOKWhileHealthy(b *testing.B) {
	l, _ := newTestLog(0)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.OK()
		}
	})
}
