package expiry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
)

// A dedup key is claimed before its timeout is produced and set to
// produced after (see package session for its values). Another listener
// replica that meets a claim leaves the index entry alone, so if the
// claimer's produce fails the entry is still there for a retry; only a
// key set to produced lets it settle the entry. A second silence of the
// same user in the same minute window is never dropped: if the window's
// guide was stale it is produced at once, otherwise it is held to the
// window's end and produced then, if the user is still silent. What the
// listener makes of a claim's reply is decided in verdict.go.

// claimTTL is how long a claim outlives a crashed claimer, after which the
// sweep retries its timeouts. It is well past the longest a produce and a
// spool write take, so a live claimer's claim does not lapse under it: a
// record already sent to a broker is not failed by the produce timeout,
// only by franz-go's own retries, hence the floor of 30s.
func (l *Listener) claimTTL() time.Duration { return max(30*time.Second, 3*l.cfg.ProduceTimeout) }

// dedupe claims each timeout's dedup key in one pipeline, and returns
// the replies, which say also how many replicas failed to produce a
// claimed timeout before. If any claim fails, the claims it did take are
// released before it returns the error, so that the entries do not wait
// until the claims lapse. A key whose value is already this listener's own
// claim (a release that failed earlier) is its to produce.
func (l *Listener) dedupe(ctx context.Context, found []session.Expired) ([]claimed, error) {
	got, errs := l.store.ClaimTimeouts(ctx, found, l.claim, l.claimTTL())
	replies := make([]claimed, len(found))
	taken := make([]session.Expired, 0, len(found))
	var firstErr error
	for i, reply := range got {
		if err := errs[i]; err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("dedup timeout of %q: %w", found[i].UID, err)
			}
			// One call claims a bucket's keys: one that failed part way
			// may have claimed some. A release frees only this
			// listener's own claim.
			taken = append(taken, found[i])
			continue
		}
		replies[i].outcome, replies[i].failed = session.ParseClaim(reply)
		if replies[i].outcome == session.ClaimFresh {
			taken = append(taken, found[i])
		}
	}
	if firstErr != nil {
		if err := l.resolveClaims(context.WithoutCancel(ctx), nil, nil, taken); err != nil {
			l.log.Warn("release dedup claims", "count", len(taken), "err", err)
		}
		return nil, firstErr
	}
	return replies, nil
}

// retryElsewhere releases the claims of timeouts this replica failed to
// produce, for another replica, counting the failure. decide leaves a
// timeout to another replica only when none failed it before (a claim's
// failed count of 0): a second failure spools it instead. So the count so
// far is always 0, and this replica's is the first.
func (l *Listener) retryElsewhere(ctx context.Context, es []session.Expired) error {
	if len(es) == 0 {
		return nil
	}
	return l.store.RetryEachElsewhere(ctx, es, l.claim, 0, l.claimTTL())
}

// resolveClaims sets the dedup keys of produced and spooled timeouts so,
// for the dedup window, and releases the claims of the others given so
// that a retry may claim them. A spooled one's key says so: a replica that
// finds its entry again (its settle failed, or this one crashed before it)
// settles it with the next stage waiting for the replay, as this one does.
func (l *Listener) resolveClaims(ctx context.Context, produced, spooled, release []session.Expired) error {
	var err error
	if len(produced)+len(spooled) > 0 {
		_, err = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, e := range produced {
				l.store.MarkProduced(ctx, p, e, l.cfg.DedupTTL)
			}
			for _, e := range spooled {
				l.store.MarkSpooled(ctx, p, e, l.cfg.DedupTTL)
			}
			return nil
		})
	}
	if len(release) > 0 {
		// Script calls by hash, in a pipeline of their own: the
		// releases of a batch the brake held are a storm's worth.
		err = errors.Join(err, l.store.ReleaseClaims(ctx, release, l.claim))
	}
	return err
}
