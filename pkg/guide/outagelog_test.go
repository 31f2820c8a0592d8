package guide

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/sony/gobreaker/v2"
)

// logRecorder is a slog handler that keeps the records of Info and up.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

var _ slog.Handler = (*logRecorder)(nil)

func (r *logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler           { return r }
func (r *logRecorder) WithGroup(string) slog.Handler                { return r }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// count returns how many records of level had msg.
func (r *logRecorder) count(level slog.Level, msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if rec.Level == level && rec.Message == msg {
			n++
		}
	}
	return n
}

// TestOutageLogsQuietly: a gateway outage that fails many sends logs one
// line when it starts and one when it ends, not one per record or probe.
func TestOutageLogsQuietly(t *testing.T) {
	e := newEnv(t)
	rec := &logRecorder{}
	e.log = slog.New(rec)
	e.gw.SetDown(true)
	errs0, opens0 := sendErrors(t), breakerOpens(t)
	r := e.start(e.cfg)
	evs := e.produce(uids("quiet", 16)...)

	waitFor(t, "three failed probes", func() bool { return breakerOpens(t)-opens0 >= 4 })
	e.gw.SetDown(false)
	e.waitShown(evs)
	e.waitCommittedToEnd(e.cfg.Group)
	waitFor(t, "the breaker to close", func() bool { return r.c.breaker.State() == gobreaker.StateClosed })
	r.stop()

	if n := sendErrors(t) - errs0; n < float64(e.cfg.BreakerFailures+3) {
		t.Fatalf("%v failed sends: the outage was too short to tell", n)
	}
	for _, want := range []struct {
		level slog.Level
		msg   string
		n     int
	}{
		{slog.LevelWarn, "send guides failing", 1},
		{slog.LevelWarn, "send guides still failing", 0}, // the outage is shorter than the summary interval
		{slog.LevelInfo, "send guides recovered", 1},
		{slog.LevelWarn, "circuit breaker state changed", 1},
		{slog.LevelInfo, "circuit breaker state changed", 1},
		{slog.LevelWarn, "guide not settled, will retry", 0},
	} {
		if got := rec.count(want.level, want.msg); got != want.n {
			t.Errorf("%s %q logged %d times, want %d", want.level, want.msg, got, want.n)
		}
	}
}
