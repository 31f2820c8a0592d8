package session

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scripts take their time from Redis (TIME), so deadlines never depend
// on a gateway's or listener's clock. Keys a script computes from ARGV share
// the declared keys' hash tag, so they live in the same cluster slot.

// renewScript sets the session key's TTL and its deadline-index entry in one
// step. KEYS: session, index, segments. ARGV: uid, ttl ms, segment.
// Returns the deadline in ms.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('SET', KEYS[1], ARGV[3], 'PX', ttl)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
return now + ttl
`)

// endScript removes a session deliberately ended by its user.
// KEYS: session, index, segments. ARGV: uid.
var endScript = redis.NewScript(`
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
`)

// dueScript lists up to ARGV[2] index entries of one bucket whose deadline
// has passed and whose session key is gone. EXISTS on a key past its TTL
// makes Redis expire it on the spot. KEYS: index, segments.
// ARGV: session key prefix, limit. Returns {now, uid, deadline, segment, ...}.
var dueScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]), 'WITHSCORES')
local out = {now}
for i = 1, #due, 2 do
  local uid = due[i]
  if redis.call('EXISTS', ARGV[1] .. uid) == 0 then
    out[#out+1] = uid
    out[#out+1] = due[i+1]
    out[#out+1] = redis.call('HGET', KEYS[2], uid) or ''
  end
end
return out
`)

// lookupScript is dueScript for one uid whose key was reported expired.
// KEYS: session, index, segments. ARGV: uid. Returns {now} when the session
// is live again or already settled, else {now, uid, deadline, segment}.
var lookupScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 1 then return {now} end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score then return {now} end
return {now, ARGV[1], score, redis.call('HGET', KEYS[3], ARGV[1]) or ''}
`)

// settleScript removes index entries whose timeouts are safely produced, but
// only when the deadline is still the one produced: a renewal in between
// wrote a new deadline that must stay. KEYS: index, segments.
// ARGV: session key prefix, then uid, deadline pairs.
var settleScript = redis.NewScript(`
local n = 0
for i = 2, #ARGV, 2 do
  local uid = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], uid)
  if score and tonumber(score) == tonumber(ARGV[i+1]) then
    redis.call('ZREM', KEYS[1], uid)
    if redis.call('EXISTS', ARGV[1] .. uid) == 0 then
      redis.call('HDEL', KEYS[2], uid)
    end
    n = n + 1
  end
end
return n
`)

// Expired is a session whose deadline passed without a renewal.
type Expired struct {
	UID      string
	Segment  string
	Deadline time.Time // when the session's TTL ran out
	Detected time.Time // when Redis reported it gone, by Redis's clock
}

// Store reads and writes sessions in Redis.
type Store struct {
	rdb redis.UniversalClient
	ks  Keyspace
}

// NewStore returns a Store over rdb.
func NewStore(rdb redis.UniversalClient, ks Keyspace) *Store {
	return &Store{rdb: rdb, ks: ks}
}

// Keyspace is the store's key layout.
func (s *Store) Keyspace() Keyspace { return s.ks }

// Renew grants uid's session ttl from now, by Redis's clock, in one round
// trip, and returns the new deadline.
func (s *Store) Renew(ctx context.Context, uid, segment string, ttl time.Duration) (time.Time, error) {
	b := Bucket(uid)
	ms, err := renewScript.Run(ctx, s.rdb,
		[]string{s.ks.SessionKey(uid), s.ks.IndexKey(b), s.ks.SegmentsKey(b)},
		uid, ttl.Milliseconds(), segment).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("renew session %q: %w", uid, err)
	}
	return time.UnixMilli(ms), nil
}

// End deletes uid's session and its index entry, so no timeout follows.
func (s *Store) End(ctx context.Context, uid string) error {
	b := Bucket(uid)
	err := endScript.Run(ctx, s.rdb,
		[]string{s.ks.SessionKey(uid), s.ks.IndexKey(b), s.ks.SegmentsKey(b)}, uid).Err()
	if err != nil {
		return fmt.Errorf("end session %q: %w", uid, err)
	}
	return nil
}

// Live reports whether uid has a session that has not run out.
func (s *Store) Live(ctx context.Context, uid string) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.ks.SessionKey(uid)).Result()
	if err != nil {
		return false, fmt.Errorf("check session %q: %w", uid, err)
	}
	return n == 1, nil
}

// Due lists expired sessions still in the deadline index, up to limit per
// bucket, with one pipelined script call per bucket. It also returns
// Redis's clock at the sweep.
func (s *Store) Due(ctx context.Context, limit int) ([]Expired, time.Time, error) {
	cmds := make([]*redis.Cmd, Buckets)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for b := range Buckets {
			cmds[b] = dueScript.Eval(ctx, p,
				[]string{s.ks.IndexKey(b), s.ks.SegmentsKey(b)},
				s.ks.SessionKeyPrefix(b), limit)
		}
		return nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("sweep deadline index: %w", err)
	}
	var out []Expired
	var now time.Time
	for _, cmd := range cmds {
		got, t, err := parseExpired(cmd)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("sweep deadline index: %w", err)
		}
		out = append(out, got...)
		if t.After(now) {
			now = t
		}
	}
	return out, now, nil
}

// Lookup checks a session reported expired. It returns ok false when the
// session is live again or its timeout was already settled.
func (s *Store) Lookup(ctx context.Context, uid string) (Expired, bool, error) {
	b := Bucket(uid)
	cmd := lookupScript.Run(ctx, s.rdb,
		[]string{s.ks.SessionKey(uid), s.ks.IndexKey(b), s.ks.SegmentsKey(b)}, uid)
	got, _, err := parseExpired(cmd)
	if err != nil {
		return Expired{}, false, fmt.Errorf("look up expired session %q: %w", uid, err)
	}
	if len(got) == 0 {
		return Expired{}, false, nil
	}
	return got[0], true, nil
}

// Settle removes the index entries of timeouts that are safely produced.
// An entry whose deadline changed since (the user came back) stays.
func (s *Store) Settle(ctx context.Context, done []Expired) error {
	byBucket := make(map[int][]any)
	for _, e := range done {
		b := Bucket(e.UID)
		byBucket[b] = append(byBucket[b], e.UID, e.Deadline.UnixMilli())
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for b, pairs := range byBucket {
			args := append([]any{s.ks.SessionKeyPrefix(b)}, pairs...)
			settleScript.Eval(ctx, p, []string{s.ks.IndexKey(b), s.ks.SegmentsKey(b)}, args...)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("settle %d timeouts: %w", len(done), err)
	}
	return nil
}

var errReply = errors.New("unexpected script reply")

// parseExpired decodes {now, uid, deadline, segment, ...}.
func parseExpired(cmd *redis.Cmd) ([]Expired, time.Time, error) {
	vals, err := cmd.Slice()
	if err != nil {
		return nil, time.Time{}, err
	}
	if len(vals) == 0 || (len(vals)-1)%3 != 0 {
		return nil, time.Time{}, fmt.Errorf("%w: %d values", errReply, len(vals))
	}
	nowMS, ok := vals[0].(int64)
	if !ok {
		return nil, time.Time{}, fmt.Errorf("%w: time %v", errReply, vals[0])
	}
	now := time.UnixMilli(nowMS)
	out := make([]Expired, 0, (len(vals)-1)/3)
	for i := 1; i < len(vals); i += 3 {
		uid, _ := vals[i].(string)
		score, _ := vals[i+1].(string)
		seg, _ := vals[i+2].(string)
		ms, err := strconv.ParseFloat(score, 64)
		if uid == "" || err != nil {
			return nil, time.Time{}, fmt.Errorf("%w: entry %v %v", errReply, vals[i], vals[i+1])
		}
		if seg == "" {
			seg = DefaultSegment
		}
		out = append(out, Expired{UID: uid, Segment: seg, Deadline: time.UnixMilli(int64(ms)), Detected: now})
	}
	return out, now, nil
}
