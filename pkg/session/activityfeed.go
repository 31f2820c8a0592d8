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
// interval for a partition that lagged, keeps the hash to the topic's
// partitions, and reads the clock. ARGV: gap max ms, topic, partition
// count (0: not checked), stamp interval ms (0: not said), then
// partition, Unix ms, ...
var activityCaughtUpScript = newScript[feedKeys]("activity_caught_up",
	activityVocab{ActivityLag: BlindActivityLag, StampField: activityStampField}, []codec{blindFormat})

// activityVocab is the words the activity feed's script writes: the blind
// reason it records and the hash's field for the stamp interval.
type activityVocab struct{ ActivityLag, StampField string }

// activityStampField is the watermark hash's field for how often its
// members stamp, in ms. Not a number, so never read as a partition (nor
// by a listener that predates it).
const activityStampField = "stamp"

// FeedStamp is what one member of the activity feed stamps.
type FeedStamp struct {
	// Gap is the longest step of a partition's time that is not a blind
	// interval (BlindActivityLag).
	Gap time.Duration
	// Topic and Partitions, when Partitions is more than 0, say which
	// partitions there are: the watermark of another topic is dropped,
	// and so is a partition past the count; one not stamped yet holds
	// every deadline until it is.
	Topic      string
	Partitions int
	// Every is how often this member stamps (0: not said). It is written
	// beside the watermark, so that the listener knows when the next stamp
	// can move it (Control.ActivityStamp); the last member to say it wins.
	Every time.Duration
	// CaughtUp is, for each partition, the time before which every record
	// appended to it has been applied.
	CaughtUp map[int32]time.Time
}

// ActivityClock is Redis's clock as the control keys' node keeps it: the
// time a consumer stamps its caught-up partitions with, read before it
// asks Kafka for their end offsets.
func (s *Store) ActivityClock(ctx context.Context) (time.Time, error) {
	return s.ActivityCaughtUp(ctx, FeedStamp{})
}

// ActivityCaughtUp records a member's stamp. A partition's time never
// moves back; one that steps by more than the gap records a blind
// interval of everyone over the step. It returns Redis's clock.
func (s *Store) ActivityCaughtUp(ctx context.Context, st FeedStamp) (time.Time, error) {
	args := make([]any, 0, 4+2*len(st.CaughtUp))
	args = append(args, st.Gap.Milliseconds(), st.Topic, st.Partitions, st.Every.Milliseconds())
	for p, t := range st.CaughtUp {
		args = append(args, strconv.FormatInt(int64(p), 10), t.UnixMilli())
	}
	ms, err := activityCaughtUpScript.Run(ctx, s.rdb, feedKeys{Activity: s.ks.ActivityKey(), Blind: s.ks.BlindKey()}, args...).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("activity watermark: %w", err)
	}
	return time.UnixMilli(ms), nil
}

// activityUnstamped is the field of the watermark hash that a feed member
// sets as it starts. It counts only while no partition is in the hash:
// the listener then holds every deadline, as for a partition not yet
// stamped. The first stamp of a member writes the topic's partitions,
// and from then on they decide.
const activityUnstamped = "unstamped"

// ActivityFeedStarting marks that a member of the activity feed is
// starting, before it reads anything and without Kafka: a feed that
// cannot reach Kafka from its start, and so never stamps, holds every
// deadline instead of none. Where partitions were stamped before, it
// changes nothing. ForgetActivity removes it with the rest.
//
// The mark is Redis's time: a partition's first stamp more than the gap
// after it records an activity-lag blind interval from it, as a step of a
// stamped partition does (the records the platform could not produce
// meanwhile come after), and clears it.
func (s *Store) ActivityFeedStarting(ctx context.Context) error {
	now, err := s.ActivityClock(ctx)
	if err != nil {
		return fmt.Errorf("mark the activity feed: %w", err)
	}
	if err := s.rdb.HSetNX(ctx, s.ks.ActivityKey(), activityUnstamped, now.UnixMilli()).Err(); err != nil {
		return fmt.Errorf("mark the activity feed: %w", err)
	}
	return nil
}

// ForgetActivity drops the activity feed's watermark, as an operator does
// who turns the feed off for good: until then, a consumer that stopped
// (or a member that started and never stamped) holds every deadline past
// its partitions' times.
func (s *Store) ForgetActivity(ctx context.Context) error {
	if err := s.rdb.Del(ctx, s.ks.ActivityKey()).Err(); err != nil {
		return fmt.Errorf("forget activity watermark: %w", err)
	}
	return nil
}

// ActivityWatermarks reads the feed's watermark, each partition's time,
// and Redis's clock, without marking a sweep: for an operator's look.
func (s *Store) ActivityWatermarks(ctx context.Context) (now time.Time, parts map[int32]time.Time, err error) {
	c, err := s.ActivityControl(ctx)
	return c.Now, c.Activity, err
}

// ActivityControl is ActivityWatermarks as the control state: Now,
// Activity and ActivityUnstamped.
func (s *Store) ActivityControl(ctx context.Context) (Control, error) {
	now, err := s.ActivityClock(ctx)
	if err != nil {
		return Control{}, err
	}
	all, err := s.rdb.HGetAll(ctx, s.ks.ActivityKey()).Result()
	if err != nil {
		return Control{}, fmt.Errorf("read activity watermark: %w", err)
	}
	flat := make([]any, 0, 2*len(all))
	for p, v := range all {
		flat = append(flat, p, v)
	}
	c := Control{Now: now, ActivityUnstamped: hasField(flat, activityUnstamped)}
	c.Activity, c.ActivityStamp = parseActivity(flat)
	return c, nil
}

// hasField reports whether a hash, as HGETALL gives it, has the field.
func hasField(flat []any, field string) bool {
	for i := 0; i+1 < len(flat); i += 2 {
		if f, _ := flat[i].(string); f == field {
			return true
		}
	}
	return false
}

// parseActivity reads the watermark hash, as HGETALL gives it: a field a
// partition, a value Unix ms (nil when there is none); and the stamp
// interval its members said, 0 when none did.
func parseActivity(flat []any) (out map[int32]time.Time, stamp time.Duration) {
	for i := 0; i+1 < len(flat); i += 2 {
		p, _ := flat[i].(string)
		v, _ := flat[i+1].(string)
		if p == activityStampField {
			if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms > 0 && ms <= maxActivityStamp.Milliseconds() {
				stamp = time.Duration(ms) * time.Millisecond
			}
			continue
		}
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
	return out, stamp
}

// maxActivityStamp bounds the stamp interval read back: a larger value is
// not a member's (the feed's own bound is 10s), and is read as none said.
const maxActivityStamp = time.Minute
