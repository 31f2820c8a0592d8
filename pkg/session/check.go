package session

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// checkScript reads whether a session key exists, when the user last
// renewed or ended it, and Redis's clock, in one round trip. Returns
// {EXISTS, now ms, last renewal ms or 0}.
var checkScript = newScript[checkKeys]("check", nil, nil)

// Check is what Redis said about a user's session.
type Check struct {
	Live    bool      // the session key exists: the user came back
	Now     time.Time // Redis's clock when it looked
	Renewed time.Time // when the user last renewed or ended the session; zero if unknown
}

// Check asks Redis whether uid's session is live, when it was last
// renewed, and what time it is there, in one round trip.
func (s *Store) Check(ctx context.Context, uid string) (Check, error) {
	got, errs := s.CheckMany(ctx, []string{uid})
	return got[0], errs[0]
}

// CheckMany is Check for many users in one pipelined round trip: a
// consumer checking each record it sends pays one round trip per batch,
// not per record, which in a storm is most of what it asks of Redis.
// Answers and errors are per uid, in the order given.
func (s *Store) CheckMany(ctx context.Context, uids []string) ([]Check, []error) {
	// While a slot migrates, the check of a user whose keys are split or
	// partly missing (an ended session has no session key) is refused
	// with TRYAGAIN until the slot has moved: sent again, as a renewal
	// is, for as long as a slot of a bucket takes to move, within ctx.
	cmds := s.runScripts(ctx, len(uids), func(i int) (*redis.Script, []string, []any) {
		return checkScript.call(checkKeys{Session: s.ks.SessionKey(uids[i]), Renewed: s.ks.RenewedKey(uids[i])})
	}, DefaultSlotRetry)
	out := make([]Check, len(uids))
	errs := make([]error, len(uids))
	for i, cmd := range cmds {
		res, err := cmd.Int64Slice()
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("check session %q: %w", uids[i], err)
		case len(res) != 3:
			errs[i] = fmt.Errorf("check session %q: script returned %d values, want 3", uids[i], len(res))
		default:
			out[i] = Check{Live: res[0] == 1, Now: time.UnixMilli(res[1])}
			if res[2] > 0 {
				out[i].Renewed = time.UnixMilli(res[2])
			}
		}
	}
	return out, errs
}
