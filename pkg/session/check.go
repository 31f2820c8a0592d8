package session

import (
	"context"
	"fmt"
	"time"
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
	res, err := checkScript.Run(ctx, s.rdb, checkKeys{Session: s.ks.SessionKey(uid), Renewed: s.ks.RenewedKey(uid)}).Int64Slice()
	if err != nil {
		return Check{}, fmt.Errorf("check session %q: %w", uid, err)
	}
	if len(res) != 3 {
		return Check{}, fmt.Errorf("check session %q: script returned %d values, want 3", uid, len(res))
	}
	c := Check{Live: res[0] == 1, Now: time.UnixMilli(res[1])}
	if res[2] > 0 {
		c.Renewed = time.UnixMilli(res[2])
	}
	return c, nil
}
