package expiry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
)

// A dedup key is claimed before its timeout is produced and marked
// produced after (see package session for its values). Another listener
// replica that meets a claim leaves the index entry alone, so if the
// claimer's produce fails the entry is still there for a retry; only a
// produced mark lets it settle the entry. A second silence of the same
// user in the same minute window is never dropped: if the window's guide
// was stale it is produced at once, otherwise it is held to the window's
// end and produced then, if the user is still silent.
type dedupState int

const (
	dedupFresh   dedupState = iota // claimed by us: produce it
	dedupDone                      // produced already: settle the entry
	dedupBusy                      // claimed by another replica: leave it
	dedupHeld                      // held (the brake, or deferred to the window's end)
	dedupDefer                     // the window's guide may have gone out: defer
	dedupSpooled                   // spooled already: settle it, its next stage after the replay
)

const dedupClaimed = session.DedupClaimed

// holdMinute names holds of a second silence to its window's end.
const holdMinute = "minute"

// claimTTL is how long a claim outlives a crashed claimer, after which the
// sweep retries its timeouts. It is well past the longest a produce and a
// spool write take, so a live claimer's claim does not lapse under it: a
// record already sent to a broker is not failed by the produce timeout,
// only by franz-go's own retries, hence the floor of 30s.
func (l *Listener) claimTTL() time.Duration { return max(30*time.Second, 3*l.cfg.ProduceTimeout) }

// distinct keeps the first of found's entries per dedup key: a batch
// from expired events can hold a uid twice, and the second would meet
// this listener's own claim.
func (l *Listener) distinct(found []session.Expired) []session.Expired {
	ks := l.store.Keyspace()
	seen := make(map[string]bool, len(found))
	out := found[:0:0]
	for _, e := range found {
		k := ks.StageDedupKey(e.UID, e.Stage, e.Due)
		if !seen[k] {
			seen[k] = true
			out = append(out, e)
		}
	}
	return out
}

// dedupe claims each timeout's dedup key in one pipeline, and returns
// also, by uid, how many replicas failed to produce a claimed timeout
// before. If any claim fails, the claims it did take are released before
// it returns the error, so that the entries are not held up until the
// claims lapse. A key that already holds this listener's own claim (a
// release that failed earlier) is its to produce.
func (l *Listener) dedupe(ctx context.Context, found []session.Expired) ([]dedupState, map[string]int, error) {
	cmds := make([]*redis.Cmd, len(found))
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range found {
			cmds[i] = l.store.ClaimTimeout(ctx, p, e, l.claim, l.claimTTL())
		}
		return nil
	})
	states := make([]dedupState, len(found))
	failures := map[string]int{}
	var claimed []session.Expired
	var firstErr error
	if err != nil && !errors.Is(err, redis.Nil) {
		firstErr = fmt.Errorf("dedup %d timeouts: %w", len(found), err)
	}
	for i, c := range cmds {
		reply, err := c.Text()
		val, failed := session.ParseClaim(reply)
		switch {
		case err != nil:
			if firstErr == nil {
				firstErr = fmt.Errorf("dedup timeout of %q: %w", found[i].UID, err)
			}
		case val == session.ClaimFresh:
			states[i] = dedupFresh
			claimed = append(claimed, found[i])
			if failed > 0 {
				failures[found[i].UID] = failed
			}
		case val == session.ClaimDone:
			states[i] = dedupDone
		case val == session.ClaimSpooled:
			states[i] = dedupSpooled
		case val == session.ClaimDefer:
			states[i] = dedupDefer
		default:
			states[i] = dedupBusy
		}
	}
	if firstErr != nil {
		if err := l.markDedup(context.WithoutCancel(ctx), nil, nil, claimed); err != nil {
			l.log.Warn("release dedup claims", "count", len(claimed), "err", err)
		}
		return nil, nil, firstErr
	}
	return states, failures, nil
}

// retryElsewhere releases the claims of timeouts this replica failed to
// produce, for another replica, counting the failure.
func (l *Listener) retryElsewhere(ctx context.Context, es []session.Expired, failures map[string]int) error {
	if len(es) == 0 {
		return nil
	}
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, e := range es {
			l.store.RetryElsewhere(ctx, p, e, l.claim, failures[e.UID], l.claimTTL())
		}
		return nil
	})
	return err
}

// deferToWindowEnd holds the second silences of a minute window whose
// guide may have gone out until the window ends.
func (l *Listener) deferToWindowEnd(ctx context.Context, found []session.Expired, states []dedupState) {
	byEnd := map[time.Time][]session.Expired{}
	for i, e := range found {
		if states[i] == dedupDefer {
			end := session.DedupWindowEnd(e.Due)
			byEnd[end] = append(byEnd[end], e)
			states[i] = dedupHeld
		}
	}
	for end, es := range byEnd {
		if err := l.hold(context.WithoutCancel(ctx), es, end, holdMinute); err != nil {
			l.log.Debug("defer timeouts to their window's end; the next sweep retries", "count", len(es), "err", err)
		}
	}
}

// markDedup marks produced and spooled timeouts for the dedup window, and
// releases the claims of failed ones so that a retry may claim them. A
// spooled one is marked so: a replica that finds its entry again (its
// settle failed, or this one crashed before it) settles it with the next
// stage waiting for the replay, as this one does.
func (l *Listener) markDedup(ctx context.Context, produced, spooled, failed []session.Expired) error {
	if len(produced)+len(spooled)+len(failed) == 0 {
		return nil
	}
	ks := l.store.Keyspace()
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, e := range produced {
			p.Set(ctx, ks.StageDedupKey(e.UID, e.Stage, e.Due), session.DedupProduced(e.Deadline), l.cfg.DedupTTL)
		}
		for _, e := range spooled {
			p.Set(ctx, ks.StageDedupKey(e.UID, e.Stage, e.Due), session.DedupSpooled(e.Deadline), l.cfg.DedupTTL)
		}
		for _, e := range failed {
			l.store.ReleaseClaim(ctx, p, e, l.claim)
		}
		return nil
	})
	return err
}
