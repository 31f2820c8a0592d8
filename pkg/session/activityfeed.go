package session

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// The activity feed's watermark. Activity from the platform's servers may
// sit unread in the activity topic while its consumer lags or is down: a
// silence we caused is not a silence, so the listener judges a deadline
// only once every partition has been applied past it (expiry's outage
// rules). Each consumer stamps the partitions it owns with the time, by
// Redis's clock, read before it asked Kafka for their ends, when it had
// applied every record up to them.

// activityCaughtUpScript records caught-up partitions, and a blind
// interval for a partition that lagged, and reads the clock. ARGV: gap max
// ms, then partition, Unix ms, ...
var activityCaughtUpScript = newScript[feedKeys]("activity_caught_up",
	activityReasons{ActivityLag: BlindActivityLag}, []codec{blindFormat})

// activityReasons are the blind reasons the activity feed records.
type activityReasons struct{ ActivityLag string }

// ActivityClock is Redis's clock as the control keys' node keeps it: the
// time a consumer stamps its caught-up partitions with, read before it
// asks Kafka for their end offsets.
func (s *Store) ActivityClock(ctx context.Context) (time.Time, error) {
	return s.ActivityCaughtUp(ctx, 0, nil)
}

// ActivityCaughtUp records, for each partition, that every record appended
// to it before its time has been applied. A partition's time never moves
// back; one that steps by more than gapMax records a blind interval of
// everyone over the step (BlindActivityLag). It returns Redis's clock.
func (s *Store) ActivityCaughtUp(ctx context.Context, gapMax time.Duration, parts map[int32]time.Time) (time.Time, error) {
	args := make([]any, 0, 1+2*len(parts))
	args = append(args, gapMax.Milliseconds())
	for p, t := range parts {
		args = append(args, strconv.FormatInt(int64(p), 10), t.UnixMilli())
	}
	ms, err := activityCaughtUpScript.Run(ctx, s.rdb, feedKeys{Activity: s.ks.ActivityKey(), Blind: s.ks.BlindKey()}, args...).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("activity watermark: %w", err)
	}
	return time.UnixMilli(ms), nil
}

// ForgetActivity drops the activity feed's watermark, as an operator does
// who turns the feed off for good: until then, a consumer that stopped
// holds every deadline past its partitions' times.
func (s *Store) ForgetActivity(ctx context.Context) error {
	if err := s.rdb.Del(ctx, s.ks.ActivityKey()).Err(); err != nil {
		return fmt.Errorf("forget activity watermark: %w", err)
	}
	return nil
}

// ActivityWatermarks reads the feed's watermark, each partition's time,
// and Redis's clock, without marking a sweep: for an operator's look.
func (s *Store) ActivityWatermarks(ctx context.Context) (now time.Time, parts map[int32]time.Time, err error) {
	if now, err = s.ActivityClock(ctx); err != nil {
		return time.Time{}, nil, err
	}
	all, err := s.rdb.HGetAll(ctx, s.ks.ActivityKey()).Result()
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("read activity watermark: %w", err)
	}
	flat := make([]any, 0, 2*len(all))
	for p, v := range all {
		flat = append(flat, p, v)
	}
	return now, parseActivity(flat), nil
}

// parseActivity reads the watermark hash, as HGETALL gives it: a field a
// partition, a value Unix ms. Nil when empty.
func parseActivity(flat []any) map[int32]time.Time {
	var out map[int32]time.Time
	for i := 0; i+1 < len(flat); i += 2 {
		p, _ := flat[i].(string)
		v, _ := flat[i+1].(string)
		part, err1 := strconv.ParseInt(p, 10, 32)
		ms, err2 := strconv.ParseInt(v, 10, 64)
		if err1 != nil || err2 != nil || part < 0 || ms < 0 {
			continue // not ours: a partition is a number, its time Unix ms
		}
		if out == nil {
			out = map[int32]time.Time{}
		}
		out[int32(part)] = time.UnixMilli(ms)
	}
	return out
}
