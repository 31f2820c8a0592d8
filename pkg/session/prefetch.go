package session

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// The prefetch path of the listener: instead of asking every bucket what
// is due, a listener reads what falls due within the next moment (a
// window of each bucket it owns, Prefetch), sets a timer per entry, and
// asks dueScript about the entries whose timers fired (Confirm). Both
// can carry the sweep mark in their pipeline, after their reads.

// windowScript reads one sorted set (an index or a hold set) around now,
// by Redis's clock: up to ARGV[3] members already due (-inf..now), and up
// to ARGV[3] members of the new part of the window, from after ARGV[1]
// (or now, when that is "" or past) to now+ARGV[2]. It reads one key, as
// candidatesScript does, so that a migrating slot never refuses it.
// ARGV: from ms or "", ahead ms, limit. Returns {now, count of the
// overdue, uid, score, ...}, the overdue first.
var windowScript = newScript[setKeys]("window", nil, nil)

// WindowRead is one window to read: of bucket b's index, or its hold set.
type WindowRead struct {
	Bucket int
	Hold   bool
	// From is the end of what was read of this set before, in Redis ms:
	// the new part starts after it. 0 when nothing was: from now.
	From  int64
	Ahead time.Duration
	Limit int
}

// Timed is a member of an index (its due time) or a hold set (its
// release time), in Redis ms.
type Timed struct {
	UID string
	At  int64
}

// Window is what one WindowRead found.
type Window struct {
	Now     int64   // Redis's clock, ms
	Entries []Timed // those already due first, then the new part, each by score
	Overdue int     // how many of Entries were already due
	// Cut is true when the new part filled the limit: the set holds more
	// before now+ahead, from the last entry's score on.
	Cut bool
}

// Marked is the sweep mark a pipeline carried after its reads: the
// control state, or why the mark failed.
type Marked struct {
	Control Control
	Err     error
}

// Prefetch reads the windows of reads in one pipeline and, when m is not
// nil, marks a sweep (as Mark does) after them in the same pipeline. err
// is the first read that failed; the mark's own outcome is in Marked.
func (s *Store) Prefetch(ctx context.Context, reads []WindowRead, m *SweepMark) ([]Window, Marked, error) {
	n := len(reads)
	if m != nil {
		n++
	}
	cmds := s.runScripts(ctx, n, func(i int) (*redis.Script, []string, []any) {
		if i == len(reads) {
			return s.markCall(*m)
		}
		r := reads[i]
		key := s.ks.IndexKey(r.Bucket)
		if r.Hold {
			key = s.ks.HoldKey(r.Bucket)
		}
		from := ""
		if r.From > 0 {
			from = fmt.Sprint(r.From)
		}
		return windowScript.call(setKeys{Set: key}, from, r.Ahead.Milliseconds(), r.Limit)
	}, 0)
	var marked Marked
	if m != nil {
		marked.Control, marked.Err = parseControl(cmds[len(reads)])
	}
	wins := make([]Window, len(reads))
	for i, r := range reads {
		w, err := parseWindow(cmds[i], r.Limit)
		if err != nil {
			return nil, marked, fmt.Errorf("prefetch bucket %d: %w", r.Bucket, err)
		}
		wins[i] = w
	}
	return wins, marked, nil
}

func parseWindow(cmd *redis.Cmd, limit int) (Window, error) {
	vals, err := cmd.Slice()
	if err != nil {
		return Window{}, err
	}
	if len(vals) < 2 || len(vals)%2 != 0 {
		return Window{}, fmt.Errorf("%w: %d values", errReply, len(vals))
	}
	now, ok1 := vals[0].(int64)
	overdue, ok2 := vals[1].(int64)
	if !ok1 || !ok2 || overdue < 0 || int(overdue)*2 > len(vals)-2 {
		return Window{}, fmt.Errorf("%w: window head %v %v", errReply, vals[0], vals[1])
	}
	w := Window{Now: now, Overdue: int(overdue), Entries: make([]Timed, 0, (len(vals)-2)/2)}
	for i := 2; i < len(vals); i += 2 {
		uid, _ := vals[i].(string)
		at, ok := scoreOf(vals[i+1])
		if uid == "" || !ok {
			return Window{}, fmt.Errorf("%w: window entry %v %v", errReply, vals[i], vals[i+1])
		}
		w.Entries = append(w.Entries, Timed{UID: uid, At: at})
	}
	w.Cut = len(w.Entries)-w.Overdue >= limit
	return w, nil
}

// Candidate is an entry whose timer fired: of the index, or of the hold
// set (Held), whose release dueScript then carries out.
type Candidate struct {
	UID  string
	Held bool
}

// NotDue is a candidate dueScript did not find due, and where it is now:
// its index score (InIndex), or its release time (Held), in Redis ms.
type NotDue struct {
	UID     string
	Index   int64
	InIndex bool
	Release int64
	Held    bool
	// Staged: its index entry is a stage past the first. An entry in
	// the index that is not staged is a deadline a renewal wrote.
	Staged bool
}

// Confirmed is Confirm's answer.
type Confirmed struct {
	Due []Expired
	// NotDue are the others, and where they are now: a renewal moved
	// them, or a timer fired before Redis's clock got there.
	NotDue []NotDue
	Now    int64 // Redis's clock, ms
}

// Confirm asks dueScript, by Redis's clock, which candidates are due, as
// Due does for the ones it read: one call per bucket, in one pipeline,
// followed by the sweep mark when m is not nil. Held candidates whose
// release time came are put back into the index on the way.
func (s *Store) Confirm(ctx context.Context, cands []Candidate, m *SweepMark) (Confirmed, Marked, error) {
	byBucket := map[int][]Candidate{}
	var buckets []int
	for _, c := range cands {
		b := Bucket(c.UID)
		if byBucket[b] == nil {
			buckets = append(buckets, b)
		}
		byBucket[b] = append(byBucket[b], c)
	}
	n := len(buckets)
	if m != nil {
		n++
	}
	cmds := s.runScripts(ctx, n, func(i int) (*redis.Script, []string, []any) {
		if i == len(buckets) {
			return s.markCall(*m)
		}
		b := buckets[i]
		// The held first, as dueScript takes them.
		cs := slices.Clone(byBucket[b])
		slices.SortStableFunc(cs, func(x, y Candidate) int {
			switch {
			case x.Held == y.Held:
				return 0
			case x.Held:
				return -1
			}
			return 1
		})
		held := 0
		keys := dueKeys{bucketKeys: s.ks.bucketKeys(b)}
		args := []any{len(cs), 0, 0, 1}
		for _, c := range cs {
			if c.Held {
				held++
			}
			keys.Entries = append(keys.Entries, s.ks.SessionKey(c.UID), s.ks.RouteKey(c.UID), s.ks.RouteStampKey(c.UID))
			args = append(args, c.UID)
		}
		args[1] = held
		return dueScript.call(keys, args...)
	}, 0)
	var marked Marked
	if m != nil {
		marked.Control, marked.Err = parseControl(cmds[len(buckets)])
	}
	var out Confirmed
	for i := range buckets {
		got, nd, now, err := parseDue(cmds[i])
		if err != nil {
			return Confirmed{}, marked, fmt.Errorf("confirm due timeouts: %w", err)
		}
		out.Due = append(out.Due, got...)
		out.NotDue = append(out.NotDue, nd...)
		out.Now = max(out.Now, now.UnixMilli())
	}
	return out, marked, nil
}
