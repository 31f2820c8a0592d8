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

// unasked remembers the silences whose reminder was too old to send
// (guide-max-age), while no later reminder of theirs was sent: their user
// was never asked whether they are still there, so a close of the same
// silence is dropped as too old as well. A close must never be a user's
// first word from us, least of all after an outage of ours held the
// reminder. A reminder that an earlier attempt may have shown, its
// answer lost (see mayHaveShown), is not taken for unasked when it is
// then too old. It is kept in memory: a consumer that restarts, or a
// partition that moves to another member, between the reminder and its
// close forgets it, and that close goes out as before.
type unasked struct {
	mu sync.Mutex
	m  map[string]unaskedSilence // by uid: its latest such silence
}

type unaskedSilence struct {
	deadlineMS int64
	added      time.Time
}

// unaskedMax bounds what is remembered; unaskedKeep is how long: at a
// storm of reminders dropped past it, the oldest are forgotten.
const (
	unaskedMax  = 1_000_000
	unaskedKeep = 24 * time.Hour
)

// settled takes in what became of ev: a reminder too old to send marks
// its silence unasked, one sent (or kept for the user) asks it.
func (u *unasked) settled(ev timeoutevent.Event, outcome Outcome) {
	if ev.Action == timeoutevent.ActionNotify || ev.Action == timeoutevent.ActionClose {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case outcome == OutcomeTooOld:
		if u.m == nil {
			u.m = make(map[string]unaskedSilence)
		}
		if len(u.m) >= unaskedMax {
			u.prune(time.Now())
		}
		if len(u.m) < unaskedMax {
			u.m[ev.UID] = unaskedSilence{deadlineMS: ev.DeadlineMS, added: time.Now()}
		}
	case outcome.sent() || outcome == OutcomeDuplicate:
		if s, ok := u.m[ev.UID]; ok && s.deadlineMS == ev.DeadlineMS {
			delete(u.m, ev.UID)
		}
	}
}

// mayHaveAsked takes in a reminder an earlier send may have shown, though
// it was settled too old: its silence counts as asked.
func (u *unasked) mayHaveAsked(ev timeoutevent.Event) {
	u.settled(ev, OutcomeDelivered)
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
	return ok && s.deadlineMS == ev.DeadlineMS
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
