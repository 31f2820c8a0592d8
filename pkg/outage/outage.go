// Package outage logs a failing condition quietly: one Warn line when it
// starts, at most one Warn summary per interval while it lasts, and one
// Info line when it ends. A service that renews thousands of sessions a
// second, or sends a guide per record, reports each failure to a Log
// instead of logging it, so that an outage costs a handful of lines, not
// one per call.
//
// It logs through the slog logger it is given, with the attribute keys
// below.
package outage

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultEvery is the summary interval of a Log made with every <= 0.
const DefaultEvery = 30 * time.Second

// Log attribute keys.
const (
	keyErr      = "err"      // the failure that started it, or the latest one
	keyFailures = "failures" // failures since the last line about it
	keyTotal    = "total"    // failures since it started
	keySince    = "since"    // when it started
	keyFor      = "for"      // how long it has lasted
)

// Log tracks one failing condition ("renew sessions", "sweep deadline
// index", ...). Safe for concurrent use.
type Log struct {
	log   *slog.Logger
	what  string
	every time.Duration

	// failing mirrors since != zero, so that OK on a healthy path is one
	// atomic load.
	failing atomic.Bool

	// mu guards the rest and is held while a line is logged, so that a
	// start line is always written before the summary or end line that
	// follows it.
	mu       sync.Mutex
	since    time.Time // zero when not failing
	lastLine time.Time // the start line or the latest summary
	count    int64     // failures since lastLine, the start's not included
	total    int64     // failures since since
	lastErr  error
	// A relapse within every of the last logged recovery, as in a partial
	// outage where successes and failures interleave, is quiet: it logs
	// no start line, and no end line unless it lasted long enough for a
	// summary. So a flapping condition logs at most one start and one end
	// line per interval.
	quiet       bool
	recoveredAt time.Time // the last logged recovery
}

// NewLog returns a Log of the condition what, which names it in every line
// ("<what> failing"). every is the least time between two summaries; 0
// means DefaultEvery.
func NewLog(logger *slog.Logger, what string, every time.Duration) *Log {
	if every <= 0 {
		every = DefaultEvery
	}
	return &Log{log: logger, what: what, every: every}
}

// Fail reports one failure. The first after OK (or ever) logs "<what>
// failing" with err. Later ones are counted, and at most once per interval
// one of them logs "<what> still failing" with the count since the
// previous line, the total, when it started and the latest error.
func (l *Log) Fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.total++
	l.lastErr = err
	if l.since.IsZero() {
		l.since, l.lastLine = now, now
		l.failing.Store(true)
		l.quiet = !l.recoveredAt.IsZero() && now.Sub(l.recoveredAt) < l.every
		if !l.quiet {
			l.log.Warn(l.what+" failing", keyErr, err)
		}
		return
	}
	l.count++
	if now.Sub(l.lastLine) < l.every {
		return
	}
	l.quiet = false
	l.log.Warn(l.what+" still failing", keyFailures, l.count, keyTotal, l.total,
		keySince, l.since, keyFor, now.Sub(l.since), keyErr, err)
	l.lastLine, l.count = now, 0
}

// OK reports a success. If the condition was failing it logs "<what>
// recovered" with how long it lasted, its failures and the latest error
// (unless it was a quiet relapse); otherwise it costs one atomic load.
func (l *Log) OK() {
	if !l.failing.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.since.IsZero() {
		return // another OK got here first
	}
	if !l.quiet {
		l.log.Info(l.what+" recovered", keyFor, time.Since(l.since), keyTotal, l.total, keyErr, l.lastErr)
		l.recoveredAt = time.Now()
	}
	l.since, l.lastLine, l.count, l.total, l.lastErr, l.quiet = time.Time{}, time.Time{}, 0, 0, nil, false
	l.failing.Store(false)
}

// Failing reports whether the condition is failing, and since when.
func (l *Log) Failing() (since time.Time, failing bool) {
	if !l.failing.Load() {
		return time.Time{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.since, !l.since.IsZero()
}
