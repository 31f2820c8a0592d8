package canary

import (
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/promise"
)

// recorder holds the history of every synthetic user whose cycle is
// running or whose verdicts are not all counted yet. The users' goroutines
// add to it; the judge takes it apart. Each cycle of a synthetic user is a
// uid of its own, so a user's history is short (a cycle is at most the
// window long) and is dropped whole once its cycle ended and was judged.
type recorder struct {
	mu    sync.Mutex
	users map[string]*history
}

// history is one uid's record.
type history struct {
	signals    []promise.Signal
	deliveries []promise.Delivery
	// ended is when the cycle ended (the connection closed): nothing is
	// recorded after it, so the checker's history ends there. Zero while
	// it runs.
	ended time.Time
	// counted are the verdicts already counted, by the class they were
	// counted in, so that none is counted twice in the same way.
	counted map[verdictKey]promise.Class
}

// verdictKey names one stage of one silence (or one stray delivery).
type verdictKey struct {
	deadline int64 // Unix ms
	stage    int
}

func newRecorder() *recorder { return &recorder{users: map[string]*history{}} }

func (r *recorder) user(uid string) *history {
	h := r.users[uid]
	if h == nil {
		h = &history{counted: map[verdictKey]promise.Class{}}
		r.users[uid] = h
	}
	return h
}

// signal records a signal with its outcome.
func (r *recorder) signal(s promise.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.user(s.UID).signals = append(r.user(s.UID).signals, s)
}

// delivery records a guide a device of the user showed.
func (r *recorder) delivery(d promise.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.user(d.UID).deliveries = append(r.user(d.UID).deliveries, d)
}

// end records that uid's cycle ended at: its history is complete.
func (r *recorder) end(uid string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.user(uid).ended = at
}

// users counts the uids held.
func (r *recorder) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.users)
}

// judge checks every history at now and returns the verdicts that became
// final since the last call, each once. A verdict is final when it is not
// pending and, for a cycle still running, when its bound is more than
// settle past: a signal sent before now may be recorded up to settle
// later (when its answer comes), and a second delivery of a stage may
// still come until its bound. A cycle that ended is judged for the last
// time and dropped: what is still pending then is not counted (the cycle
// outlasts every bound it can meet; see Config.cycleTimeout).
//
// A stage counted while it kept the promise may break it later: a second
// guide for it, past its bound. It is then counted once more, in its
// failure class, so that the page for it comes; the totals then hold
// that stage twice (once ok), a small error of the SLI on the safe side.
func (r *recorder) judge(cfg promise.Config, now time.Time, settle time.Duration) []promise.Verdict {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []promise.Verdict
	for uid, h := range r.users {
		ended := !h.ended.IsZero()
		end := now
		if ended {
			end = h.ended
		}
		vs := promise.Check(cfg, promise.History{Signals: h.signals, Deliveries: h.deliveries, End: end})
		out = append(out, final(vs, h.counted, ended, now, settle)...)
		if ended {
			delete(r.users, uid)
		}
	}
	return out
}

// final picks from vs the verdicts to count now, and marks them counted:
// each not counted yet, once it is final; and each counted as keeping
// the promise that breaks it now.
func final(vs []promise.Verdict, counted map[verdictKey]promise.Class, ended bool, now time.Time, settle time.Duration) []promise.Verdict {
	var out []promise.Verdict
	for _, v := range vs {
		k := verdictKey{v.Deadline.UnixMilli(), v.Stage}
		if v.Class == promise.Pending {
			continue
		}
		if was, ok := counted[k]; ok && (was.Failure() || !v.Class.Failure()) {
			continue
		}
		if !ended && now.Before(v.Bound.Add(settle)) {
			continue
		}
		counted[k] = v.Class
		out = append(out, v)
	}
	return out
}
