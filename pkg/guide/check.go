package guide

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// checkLua reads whether a session key exists, when the user last renewed
// or ended it, and Redis's clock, in one round trip. KEYS: session,
// renewed. Returns {EXISTS, TIME in ms, last renewal ms or 0}.
const checkLua = `
local t = redis.call('TIME')
return {redis.call('EXISTS', KEYS[1]), tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
  tonumber(redis.call('GET', KEYS[2]) or '0')}
`

var checkScript = redis.NewScript(checkLua)

// sessionCheck is what Redis said about a user's session.
type sessionCheck struct {
	live    bool      // the session key exists: the user came back
	now     time.Time // Redis's clock when it looked
	renewed time.Time // when the user last renewed or ended the session; zero if unknown
}

// checkSession asks Redis whether uid's session is live, and what time it
// is there. Deadlines are written from Redis's clock (see package
// session), so their age is judged against it too: the consumer's own
// clock may be off by any amount.
func (c *Consumer) checkSession(ctx context.Context, uid string) (sessionCheck, error) {
	res, err := checkScript.Run(ctx, c.rdb, []string{c.keyspace.SessionKey(uid), c.keyspace.RenewedKey(uid)}).Int64Slice()
	if err != nil {
		return sessionCheck{}, fmt.Errorf("check session %q: %w", uid, err)
	}
	if len(res) != 3 {
		return sessionCheck{}, fmt.Errorf("check session %q: script returned %d values, want 3", uid, len(res))
	}
	s := sessionCheck{live: res[0] == 1, now: time.UnixMilli(res[1])}
	if res[2] > 0 {
		s.renewed = time.UnixMilli(res[2])
	}
	return s, nil
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
// from a deadline that stage delays may have put minutes back.
func needless(ev timeoutevent.Event, s sessionCheck, maxAge time.Duration) Outcome {
	confirmed := time.UnixMilli(max(ev.DeadlineMS, ev.DetectedMS, ev.DueMS))
	switch {
	case s.now.Sub(confirmed) > maxAge:
		return OutcomeTooOld
	case s.live, s.renewed.After(ev.Deadline()):
		return OutcomeStale // they came back: no "are you still there?"
	}
	return ""
}
