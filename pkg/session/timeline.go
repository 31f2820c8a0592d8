package session

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A user's timeline is what stillthere decided about them and why, for
// the platform's support team (package timeline gives the entries their
// meaning; here they are opaque text). Each service appends the
// decisions it makes; Redis stamps each with its own clock, the clock
// every deadline is on, so that entries from different machines sort
// and read together.

var (
	timelineAddScript  = newScript[timelineAddKeys]("timeline_add", nil, nil)
	timelineReadScript = newScript[timelineKeys]("timeline_read", nil, nil)
)

// TimelineRecord is one entry for uid's timeline.
type TimelineRecord struct {
	UID   string
	Entry string
	// Ago is how long before the append the decision was made (its time
	// in the recorder's queue): the entry is stamped Redis's now less Ago.
	Ago time.Duration
}

// TimelineBounds bound every user's timeline.
type TimelineBounds struct {
	// Entries is the most a timeline keeps: the oldest go first.
	Entries int
	// Keep is how long a timeline outlives its last entry; readers skip
	// entries older than it (TimelineEntry.At).
	Keep time.Duration
}

// OrDefault fills zero bounds with the defaults: 100 entries, 24h.
func (b TimelineBounds) OrDefault() TimelineBounds {
	if b.Entries <= 0 {
		b.Entries = 100
	}
	if b.Keep <= 0 {
		b.Keep = 24 * time.Hour
	}
	return b
}

// AppendTimeline appends records to their users' timelines, in order per
// user, in one pipelined round trip (one script call per bucket), and
// returns how many Redis took and the first error. Each is stamped with
// its decision's time by Redis's clock: Redis's now less its Ago.
func (s *Store) AppendTimeline(ctx context.Context, recs []TimelineRecord, b TimelineBounds) (int, error) {
	if b.Entries < 1 || b.Keep < time.Millisecond {
		return 0, fmt.Errorf("timeline bounds %d entries, keep %v: want at least 1 and 1ms", b.Entries, b.Keep)
	}
	groups := bucketGroups(len(recs), func(i int) string { return recs[i].UID })
	cmds := s.runScripts(ctx, len(groups), func(i int) (*redis.Script, []string, []any) {
		var keys timelineAddKeys
		args := []any{b.Entries, b.Keep.Milliseconds()}
		for _, j := range groups[i] {
			keys.Entries = append(keys.Entries, s.ks.TimelineKey(recs[j].UID))
			args = append(args, max(0, recs[j].Ago.Milliseconds()), recs[j].Entry)
		}
		return timelineAddScript.call(keys, args...)
	}, DefaultSlotRetry)
	n := 0
	var first error
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			if first == nil {
				first = fmt.Errorf("append timeline of %q: %w", recs[groups[i][0]].UID, err)
			}
			continue
		}
		n += len(groups[i])
	}
	return n, first
}

// TimelineEntry is one stored entry of a timeline.
type TimelineEntry struct {
	At    time.Time // by Redis's clock, when its decision was made
	Entry string
	// Err says why the stored entry did not parse: Entry is all of it,
	// and At the time of the entry appended before it (zero if none).
	Err error
}

// Timeline reads uid's timeline in the order appended, and Redis's clock
// when it read it. Services append in batches, so an entry may follow
// one it is older than (see TimelineEntry.At). An unknown user has an
// empty timeline.
func (s *Store) Timeline(ctx context.Context, uid string) (time.Time, []TimelineEntry, error) {
	res, err := timelineReadScript.Run(ctx, s.rdb, timelineKeys{Timeline: s.ks.TimelineKey(uid)}).Slice()
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("read timeline of %q: %w", uid, err)
	}
	now, items, err := parseTimeline(res)
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("read timeline of %q: %w", uid, err)
	}
	return now, items, nil
}

// parseTimeline reads timeline_read.lua's reply.
func parseTimeline(res []any) (time.Time, []TimelineEntry, error) {
	if len(res) != 2 {
		return time.Time{}, nil, fmt.Errorf("%w: %d values, want 2", errReply, len(res))
	}
	now, ok := res[0].(int64)
	if !ok {
		return time.Time{}, nil, fmt.Errorf("%w: clock %v", errReply, res[0])
	}
	list, ok := res[1].([]any)
	if !ok {
		return time.Time{}, nil, fmt.Errorf("%w: entries %v", errReply, res[1])
	}
	out := make([]TimelineEntry, 0, len(list))
	for _, v := range list {
		raw, _ := v.(string)
		e, err := ParseTimelineEntry(raw)
		if err != nil {
			// Shown to the reader as it is, not hiding the rest, where it
			// was appended: at the time of the entry before it.
			e = TimelineEntry{Entry: raw, Err: err}
			if len(out) > 0 {
				e.At = out[len(out)-1].At
			}
		}
		out = append(out, e)
	}
	return time.UnixMilli(now), out, nil
}

// ParseTimelineEntry reads one stored entry: "<Redis ms> <entry>".
func ParseTimelineEntry(raw string) (TimelineEntry, error) {
	ms, entry, ok := strings.Cut(raw, " ")
	if !ok {
		return TimelineEntry{}, fmt.Errorf("%w: timeline entry %q has no time", errReply, raw)
	}
	at, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || at <= 0 {
		return TimelineEntry{}, fmt.Errorf("%w: timeline entry %q: bad time", errReply, raw)
	}
	return TimelineEntry{At: time.UnixMilli(at), Entry: entry}, nil
}
