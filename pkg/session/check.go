package session

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// checkScript reads, for each of users of one bucket, whether their
// session key exists, when they last renewed or ended it, and Redis's
// clock. Returns per user {EXISTS, now ms, last renewal ms or 0}.
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
// not per record, which in a storm is most of what it asks of Redis; and
// one script call per bucket, not per user, each of which cost Redis
// several times the check itself. Answers and errors are per uid, in the order given.
func (s *Store) CheckMany(ctx context.Context, uids []string) ([]Check, []error) {
	// While a slot migrates, the check of a user whose keys are split or
	// partly missing (an ended session has no session key) is refused
	// with TRYAGAIN until the slot has moved: sent again, as a renewal
	// is, for as long as a slot of a bucket takes to move, within ctx.
	groups := bucketGroups(len(uids), func(i int) string { return uids[i] })
	cmds := s.runScripts(ctx, len(groups), func(i int) (*redis.Script, []string, []any) {
		var keys checkKeys
		for _, j := range groups[i] {
			keys.Entries = append(keys.Entries, s.ks.SessionKey(uids[j]), s.ks.RenewedKey(uids[j]))
		}
		return checkScript.call(keys)
	}, DefaultSlotRetry)
	out := make([]Check, len(uids))
	errs := make([]error, len(uids))
	for i, g := range groups {
		res, err := cmds[i].Slice()
		if err == nil && len(res) != len(g) {
			err = fmt.Errorf("script returned %d checks for %d users", len(res), len(g))
		}
		for k, j := range g {
			if err != nil {
				errs[j] = fmt.Errorf("check session %q: %w", uids[j], err)
				continue
			}
			out[j], errs[j] = parseCheck(res[k])
			if errs[j] != nil {
				errs[j] = fmt.Errorf("check session %q: %w", uids[j], errs[j])
			}
		}
	}
	return out, errs
}

// parseCheck reads one user's answer of checkScript.
func parseCheck(v any) (Check, error) {
	res, ok := v.([]any)
	if !ok || len(res) != 3 {
		return Check{}, fmt.Errorf("%w: check %v", errReply, v)
	}
	var n [3]int64
	for i, f := range res {
		if n[i], ok = f.(int64); !ok {
			return Check{}, fmt.Errorf("%w: check %v", errReply, v)
		}
	}
	c := Check{Live: n[0] == 1, Now: time.UnixMilli(n[1])}
	if n[2] > 0 {
		c.Renewed = time.UnixMilli(n[2])
	}
	return c, nil
}
