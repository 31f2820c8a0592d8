package session

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A timeout's dedup key (StageDedupKey) is per uid, stage and minute
// window of when the stage was due (for stage 1, the deadline). Its value
// says what became of the window's guide, naming the silence by its
// deadline:
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

// Dedup outcomes of a claim.
const (
	ClaimFresh = "fresh" // claimed: produce it
	ClaimDone  = "done"  // this very timeout was produced already: settle it
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

// DedupProduced is a dedup key's value once the timeout with this deadline
// was produced.
func DedupProduced(deadline time.Time) string {
	return "produced:" + strconv.FormatInt(deadline.UnixMilli(), 10)
}

// DedupSpooled is a dedup key's value once the timeout with this deadline
// went to a spool.
func DedupSpooled(deadline time.Time) string {
	return "spooled:" + strconv.FormatInt(deadline.UnixMilli(), 10)
}

// claimScript claims a timeout's dedup key. KEYS: dedup key. ARGV: claim,
// deadline ms, claim TTL ms, due ms (the window's). Returns one of the Claim outcomes; a fresh
// claim as "fresh:<n>", n the replicas that failed to produce it before.
var claimScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('GET', KEYS[1])
local function claim(n)
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[3]))
  return 'fresh:' .. (n or 0)
end
if not v or v == ARGV[1] then return claim(0) end
if string.sub(v, 1, 6) == 'retry:' then return claim(tonumber(string.sub(v, 7)) or 0) end
if string.sub(v, 1, 8) == 'claimed:' then return 'busy' end
if v == 'produced' or v == 'produced:' .. ARGV[2] or v == 'stale:' .. ARGV[2] then return 'done' end
if v == 'spooled:' .. ARGV[2] then return 'spooled' end
if string.sub(v, 1, 6) == 'stale:' then return claim() end
local windowEnd = (math.floor(tonumber(ARGV[4] or ARGV[2]) / 60000) + 1) * 60000
if now >= windowEnd then return claim() end
return 'defer'
`)

// ClaimTimeout claims e's dedup key for claim, in pipeline p; the command's
// reply is one of the Claim outcomes (ParseClaim reads it).
func (s *Store) ClaimTimeout(ctx context.Context, p redis.Pipeliner, e Expired, claim string, ttl time.Duration) *redis.Cmd {
	return claimScript.Eval(ctx, p, []string{s.ks.StageDedupKey(e.UID, e.Stage, e.Due)},
		claim, e.Deadline.UnixMilli(), ttl.Milliseconds(), e.Due.UnixMilli())
}

// ParseClaim reads a claim's reply: its outcome, and for a fresh claim how
// many replicas failed to produce the timeout before.
func ParseClaim(reply string) (outcome string, failed int) {
	if n, ok := strings.CutPrefix(reply, ClaimFresh+":"); ok {
		failed, _ = strconv.Atoi(n)
		return ClaimFresh, failed
	}
	return reply, 0
}

// retryScript leaves a claimed timeout to another replica, counting the
// failure. KEYS: dedup key. ARGV: claim, failures so far, TTL ms.
var retryScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], 'retry:' .. (tonumber(ARGV[2]) + 1), 'PX', tonumber(ARGV[3]))
  return 1
end
return 0
`)

// RetryElsewhere releases e's claim for another replica to produce it,
// counting this replica's failure, in pipeline p.
func (s *Store) RetryElsewhere(ctx context.Context, p redis.Pipeliner, e Expired, claim string, failed int, ttl time.Duration) {
	retryScript.Eval(ctx, p, []string{s.ks.StageDedupKey(e.UID, e.Stage, e.Due)}, claim, failed, ttl.Milliseconds())
}

// markStaleScript records that the consumer found a produced timeout's
// silence over, if its window still holds that timeout (produced, or
// spooled and since replayed). KEYS: dedup key. ARGV: deadline ms.
var markStaleScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == 'produced:' .. ARGV[1] or v == 'spooled:' .. ARGV[1] then
  redis.call('SET', KEYS[1], 'stale:' .. ARGV[1], 'KEEPTTL')
  return 1
end
return 0
`)

// MarkStale records that uid's timeout with this deadline, at stage, due
// at due, sent no guide: another silence whose stage falls in its minute
// window gets its own at once.
func (s *Store) MarkStale(ctx context.Context, uid string, stage int, due, deadline time.Time) error {
	err := markStaleScript.Run(ctx, s.rdb, []string{s.ks.StageDedupKey(uid, stage, due)},
		deadline.UnixMilli()).Err()
	if err != nil {
		return fmt.Errorf("mark %q's timeout stale: %w", uid, err)
	}
	return nil
}
