package guide

import (
	"context"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// sessionCheck is what Redis said about a user's session.
type sessionCheck struct {
	live    bool      // the session key exists: the user came back
	now     time.Time // Redis's clock when it looked
	renewed time.Time // when the user last renewed or ended the session; zero if unknown
}

// checkSessions asks Redis whether each uid's session is live, and what
// time it is there, in one round trip. Deadlines are written from
// Redis's clock (see package session), so their age is judged against it
// too: the consumer's own clock may be off by any amount.
func (c *Consumer) checkSessions(ctx context.Context, uids []string) ([]session.Check, []error) {
	return session.NewStore(c.rdb, c.keyspace).CheckMany(ctx, uids)
}

// checkSession is checkSessions for one uid.
func (c *Consumer) checkSession(ctx context.Context, uid string) (sessionCheck, error) {
	got, errs := c.checkSessions(ctx, []string{uid})
	return checkOf(got[0]), errs[0]
}

func checkOf(s session.Check) sessionCheck {
	return sessionCheck{live: s.Live, now: s.Now, renewed: s.Renewed}
}

// needless returns the outcome of an event that needs no guide, or "" if
// it does. It reads no clock but Redis's, as s.now: an event confirmed
// longer than maxAge ago there is too old; one whose user renewed (or
// ended the session) after its deadline is stale, whether or not the
// session exists now: that silence is over, and so are its later stages.
// An event is confirmed when it is detected: at its deadline, or, for one
// the listener held through an outage, when the hold ended, so that a
// long outage does not age out the guides it only delayed. A later stage
// is confirmed no earlier than it was due: its age counts from then, not
// from a deadline that stage delays may have put minutes back. A notify
// stage is never too old: it tells the platform's servers, not the user,
// and stays true while the user stays away (its due_ms says since when);
// dropped, it would be lost, and the stages after it would overtake it.
func needless(ev timeoutevent.Event, s sessionCheck, maxAge time.Duration) Outcome {
	confirmed := time.UnixMilli(max(ev.DeadlineMS, ev.DetectedMS, ev.DueMS))
	switch {
	case s.now.Sub(confirmed) > maxAge && ev.Action != timeoutevent.ActionNotify:
		return OutcomeTooOld
	case s.live, s.renewed.After(ev.Deadline()):
		return OutcomeStale // they came back: no "are you still there?"
	}
	return ""
}
