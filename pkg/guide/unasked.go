package guide

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// unasked remembers, for the silences of more than one stage, whether
// their user was asked: whether a reminder of theirs was sent (or may
// have been shown, its answer lost: see mayHaveShown), or only dropped as
// too old to send (guide-max-age). A close of a silence whose user was
// never asked is dropped as too old as well: a close must never be a
// user's first word from us, least of all after an outage of ours held
// the reminder. A silence's last stage forgets it.
//
// It is kept in memory: a consumer that restarts, or a partition that
// moves to another member, between the reminder and its close forgets
// it, and that close goes out as before; but a reminder one member
// showed, its answer lost, then found too old by the partition's next
// owner, costs its silence's close.
type unasked struct {
	mu sync.Mutex
	m  map[string]unaskedSilence // by uid: its latest silence between stages
}

type unaskedSilence struct {
	deadlineMS int64
	asked      bool
	added      time.Time
}

// unaskedMax bounds what is remembered; unaskedKeep is how long: past
// either, the oldest are forgotten.
const (
	unaskedMax  = 1_000_000
	unaskedKeep = 24 * time.Hour
)

// settled takes in what became of ev: a reminder sent (or kept for the
// user) asks its silence, one too old to send leaves it unasked unless an
// earlier one asked it; its last stage, or a user come back, ends it.
func (u *unasked) settled(ev timeoutevent.Event, outcome Outcome) {
	if ev.Action == timeoutevent.ActionNotify && !ev.Final {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	cur, ok := u.m[ev.UID]
	same := ok && cur.deadlineMS == ev.DeadlineMS
	switch {
	case ev.Final || outcome == OutcomeStale:
		if same {
			delete(u.m, ev.UID)
		}
	case outcome == OutcomeTooOld:
		if !same {
			u.put(ev, false)
		}
	case outcome.sent() || outcome == OutcomeDuplicate:
		u.put(ev, true)
	}
}

// mayHaveAsked takes in a reminder an earlier send may have shown, though
// it was settled too old: its silence counts as asked.
func (u *unasked) mayHaveAsked(ev timeoutevent.Event) {
	if ev.Final {
		u.settled(ev, OutcomeTooOld)
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.put(ev, true)
}

// put records ev's silence, asked or not; u.mu is held.
func (u *unasked) put(ev timeoutevent.Event, asked bool) {
	if u.m == nil {
		u.m = make(map[string]unaskedSilence)
	}
	if _, ok := u.m[ev.UID]; !ok && len(u.m) >= unaskedMax {
		u.prune(time.Now())
		if len(u.m) >= unaskedMax {
			return
		}
	}
	u.m[ev.UID] = unaskedSilence{deadlineMS: ev.DeadlineMS, asked: asked, added: time.Now()}
}

// closes reports whether ev is a close of a silence whose user was never
// asked.
func (u *unasked) closes(ev timeoutevent.Event) bool {
	if ev.Action != timeoutevent.ActionClose {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	s, ok := u.m[ev.UID]
	return ok && s.deadlineMS == ev.DeadlineMS && !s.asked
}

// prune forgets what is older than unaskedKeep, or, if nothing is, half
// of what is remembered.
func (u *unasked) prune(now time.Time) {
	for uid, s := range u.m {
		if now.Sub(s.added) > unaskedKeep {
			delete(u.m, uid)
		}
	}
	for uid := range u.m {
		if len(u.m) < unaskedMax/2 {
			return
		}
		delete(u.m, uid)
	}
}

// mayHaveShown reports whether a send that failed with err may have shown
// the guide all the same: unless the downstream answered that it did not
// (a webhook's failing status; a gateway's, but a 200 this build cannot
// read and a 409, another push of the guide under way), or the request
// never left (refused here, or no connection made).
func mayHaveShown(err error) bool {
	var pe *push.Error
	var ae answerError
	var op *net.OpError
	switch {
	case errors.As(err, &pe):
		return pe.Code == http.StatusOK || pe.Code == http.StatusConflict
	case errors.As(err, &ae):
		return false
	case errors.As(err, &op) && op.Op == "dial":
		return false
	}
	return true
}
