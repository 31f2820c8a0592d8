package session

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A timeout's dedup key (StageDedupKey) is per uid, stage and minute
// window of when the stage was due (for stage 1, the deadline). Its value
// says what became of the window's guide, naming the silence by its
// deadline (dedupFormat, "<state>:<argument>"):
//
//	claimed:<listener>  a listener replica is producing it
//	produced:<ms>       the timeout with deadline ms was produced; its
//	                    guide may have gone out
//	spooled:<ms>        the timeout with deadline ms went to a listener's
//	                    spool; its guide goes out when that spool is
//	                    replayed, and the stage after it waits until then
//	stale:<ms>          the consumer found that timeout's silence over and
//	                    sent nothing
//	retry:<n>           n listener replicas failed to produce it and left
//	                    it to another
//
// So the dedup is per window without loss: a second silence in a window
// whose guide was stale gets its own guide at once; one in a window whose
// guide may have gone out is deferred to the window's end, and produced
// then if the user is still silent.

// Dedup states, the first field of a dedup key's value.
const (
	DedupClaimed  = "claimed" // a listener's claim is DedupClaimed:<listener>
	dedupProduced = "produced"
	dedupSpooled  = "spooled"
	dedupStale    = "stale"
	dedupRetry    = "retry"
)

// Dedup outcomes of a claim.
const (
	ClaimFresh = "fresh" // claimed: produce it
	ClaimDone  = "done"  // this very timeout was produced already (its guide since found stale, perhaps): settle it
	ClaimBusy  = "busy"  // another replica is producing it: leave it
	ClaimDefer = "defer" // the window's guide may have gone out: wait for its end
	// ClaimSpooled: this very timeout went to a spool: settle it, with the
	// stage after it waiting for the replay (AfterReplay).
	ClaimSpooled = "spooled"
)

// DedupWindow is the minute window of a deadline.
func DedupWindow(deadline time.Time) int64 { return deadline.UnixMilli() / 60_000 }

// DedupWindowEnd is when the minute window of a deadline ends.
func DedupWindowEnd(deadline time.Time) time.Time {
	return time.UnixMilli((DedupWindow(deadline) + 1) * 60_000)
}

// DedupClaim is a dedup key's value while listener (a replica's unique
// id) claims it.
func DedupClaim(listener string) string { return dedupFormat.encode(DedupClaimed, listener) }

// DedupProduced is a dedup key's value once the timeout with this deadline
// was produced.
func DedupProduced(deadline time.Time) string {
	return dedupFormat.encode(dedupProduced, strconv.FormatInt(deadline.UnixMilli(), 10))
}

// DedupSpooled is a dedup key's value once the timeout with this deadline
// went to a spool.
func DedupSpooled(deadline time.Time) string {
	return dedupFormat.encode(dedupSpooled, strconv.FormatInt(deadline.UnixMilli(), 10))
}

// claimScript claims the dedup keys of timeouts of one bucket, each as
// if alone, in the order given. ARGV: claim, claim TTL ms, then each
// one's deadline ms and due ms (the window's). Returns per timeout one of
// the Claim outcomes; a fresh claim laid out as a dedup value,
// "fresh:<n>", n the replicas that failed to produce it before.
var claimScript = newScript[dedupEachKeys]("claim", claimWords{
	Claimed: DedupClaimed, Produced: dedupProduced, Spooled: dedupSpooled, Stale: dedupStale, Retry: dedupRetry,
	OutFresh: ClaimFresh, OutDone: ClaimDone, OutBusy: ClaimBusy, OutDefer: ClaimDefer, OutSpooled: ClaimSpooled,
}, []codec{dedupFormat})

// claimWords are the dedup states claimScript reads and the outcomes it
// answers.
type claimWords struct {
	Claimed, Produced, Spooled, Stale, Retry         string
	OutFresh, OutDone, OutBusy, OutDefer, OutSpooled string
}

// dedupKey is the key list of e's dedup key.
func (k Keyspace) dedupKey(e Expired) dedupKeys {
	return dedupKeys{Dedup: k.StageDedupKey(e.UID, e.Stage, e.Due)}
}

// ClaimTimeouts claims the dedup key of each of es for claim: one script
// call per bucket, in one pipeline (a call per timeout cost Redis several
// times the claim itself, tens of thousands of times a storm). It returns
// each one's reply (ParseClaim reads it) or error, in the order of es.
func (s *Store) ClaimTimeouts(ctx context.Context, es []Expired, claim string, ttl time.Duration) ([]string, []error) {
	replies, errs := make([]string, len(es)), make([]error, len(es))
	groups := byBucket(es)
	cmds := s.runScripts(ctx, len(groups), func(i int) (*redis.Script, []string, []any) {
		var keys dedupEachKeys
		args := []any{claim, ttl.Milliseconds()}
		for _, j := range groups[i] {
			keys.Dedup = append(keys.Dedup, s.ks.StageDedupKey(es[j].UID, es[j].Stage, es[j].Due))
			args = append(args, es[j].Deadline.UnixMilli(), es[j].Due.UnixMilli())
		}
		return claimScript.call(keys, args...)
	}, 0)
	for i, g := range groups {
		got, err := cmds[i].StringSlice()
		if err == nil && len(got) != len(g) {
			err = fmt.Errorf("%w: %d claims for %d timeouts", errReply, len(got), len(g))
		}
		for k, j := range g {
			if err != nil {
				errs[j] = err
				continue
			}
			replies[j] = got[k]
		}
	}
	return replies, errs
}

// byBucket groups the indexes of es by bucket, each group in the order
// of es.
func byBucket(es []Expired) [][]int {
	return bucketGroups(len(es), func(i int) string { return es[i].UID })
}

// bucketGroups groups the indexes 0..n-1 by the bucket of each one's
// user, each group in increasing order.
func bucketGroups(n int, uid func(int) string) [][]int {
	at := map[int]int{}
	var groups [][]int
	for i := range n {
		b := Bucket(uid(i))
		g, ok := at[b]
		if !ok {
			g = len(groups)
			at[b] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// ParseClaim reads a claim's reply: its outcome, and for a fresh claim how
// many replicas failed to produce the timeout before.
func ParseClaim(reply string) (outcome string, failed int) {
	if f, ok := dedupFormat.decode(reply); ok && f[0] == ClaimFresh {
		failed, _ = strconv.Atoi(f[1])
		return ClaimFresh, failed
	}
	return reply, 0
}

// retryScript leaves a claimed timeout to another replica, counting the
// failure. ARGV: claim, failures so far, TTL ms.
var retryScript = newScript[dedupKeys]("retry_elsewhere", retryWords{Retry: dedupRetry}, []codec{dedupFormat})

// retryWords is the dedup state retryScript writes.
type retryWords struct{ Retry string }

// RetryElsewhere releases e's claim for another replica to produce it,
// counting this replica's failure, in pipeline p.
func (s *Store) RetryElsewhere(ctx context.Context, p redis.Pipeliner, e Expired, claim string, failed int, ttl time.Duration) {
	retryScript.Eval(ctx, p, s.ks.dedupKey(e), claim, failed, ttl.Milliseconds())
}

// RetryEachElsewhere is RetryElsewhere for each of es, in one pipeline of
// script calls by hash. It returns the first error.
func (s *Store) RetryEachElsewhere(ctx context.Context, es []Expired, claim string, failed int, ttl time.Duration) error {
	return firstErr(s.runScripts(ctx, len(es), func(i int) (*redis.Script, []string, []any) {
		return retryScript.call(s.ks.dedupKey(es[i]), claim, failed, ttl.Milliseconds())
	}, 0))
}

// markStaleScript records that the consumer found a produced timeout's
// silence over, if its window still holds that timeout (produced, or
// spooled and since replayed). ARGV: deadline ms.
var markStaleScript = newScript[dedupKeys]("mark_stale",
	staleWords{Produced: dedupProduced, Spooled: dedupSpooled, Stale: dedupStale}, []codec{dedupFormat})

// staleWords are the dedup states markStaleScript reads and writes.
type staleWords struct{ Produced, Spooled, Stale string }

// MarkStale records that uid's timeout with this deadline, at stage, due
// at due, sent no guide: another silence whose stage falls in its minute
// window gets its own at once. A key still claimed (its producer has not
// marked it yet) is left as it is: the mark is lost, and that other
// silence is deferred to the window's end, as after a guide.
func (s *Store) MarkStale(ctx context.Context, uid string, stage int, due, deadline time.Time) error {
	err := markStaleScript.Run(ctx, s.rdb, dedupKeys{Dedup: s.ks.StageDedupKey(uid, stage, due)}, deadline.UnixMilli()).Err()
	if err != nil {
		return fmt.Errorf("mark %q's timeout stale: %w", uid, err)
	}
	return nil
}

// MarkProduced marks e produced for its dedup window, in pipeline p.
func (s *Store) MarkProduced(ctx context.Context, p redis.Pipeliner, e Expired, ttl time.Duration) {
	p.Set(ctx, s.ks.StageDedupKey(e.UID, e.Stage, e.Due), DedupProduced(e.Deadline), ttl)
}

// MarkSpooled marks e spooled for its dedup window, in pipeline p: its
// guide goes out when the spool is replayed, and the stage after it
// waits for that (AfterReplay).
func (s *Store) MarkSpooled(ctx context.Context, p redis.Pipeliner, e Expired, ttl time.Duration) {
	p.Set(ctx, s.ks.StageDedupKey(e.UID, e.Stage, e.Due), DedupSpooled(e.Deadline), ttl)
}

// releaseScript deletes each of a bucket's dedup keys that is still the
// caller's claim. ARGV: claim.
var releaseScript = newScript[dedupEachKeys]("release_claim", nil, nil)

// ReleaseClaims releases the claim of each of es, if it is still claim,
// so that a retry may claim it: one script call per bucket, in one
// pipeline. It returns the first error.
func (s *Store) ReleaseClaims(ctx context.Context, es []Expired, claim string) error {
	groups := byBucket(es)
	return firstErr(s.runScripts(ctx, len(groups), func(i int) (*redis.Script, []string, []any) {
		var keys dedupEachKeys
		for _, j := range groups[i] {
			keys.Dedup = append(keys.Dedup, s.ks.StageDedupKey(es[j].UID, es[j].Stage, es[j].Due))
		}
		return releaseScript.call(keys, claim)
	}, 0))
}

// firstErr is the first error of cmds, if any.
func firstErr(cmds []*redis.Cmd) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
	}
	return nil
}
