package activityfeed

import "time"

// tracker decides when a partition of the activity topic has caught up:
// it keeps, for each partition this consumer owns, the next offset not yet
// applied and the checkpoints taken since (a time by Redis's clock, read
// before asking Kafka for the partition's end, and that end). Once every
// record before a checkpoint's end is applied, every record appended
// before its time is: that time is the partition's watermark. It is pure:
// the feed's loop owns it and does the I/O.
type tracker struct {
	parts map[int32]*partition
}

type partition struct {
	next    int64        // the next offset not yet applied; -1 unknown
	pending []checkpoint // ascending by time and end
}

type checkpoint struct {
	at  time.Time
	end int64
}

// maxPending bounds the checkpoints kept per partition while it lags.
// Dropping the oldest only delays its watermark to a later checkpoint:
// the safe side.
const maxPending = 64

func newTracker() *tracker { return &tracker{parts: map[int32]*partition{}} }

// assign starts tracking p, its position unknown until known.
func (t *tracker) assign(p int32) {
	if _, ok := t.parts[p]; !ok {
		t.parts[p] = &partition{next: -1}
	}
}

// revoke stops tracking p: another consumer owns it now.
func (t *tracker) revoke(p int32) { delete(t.parts, p) }

// owned lists the partitions tracked.
func (t *tracker) owned() []int32 {
	ps := make([]int32, 0, len(t.parts))
	for p := range t.parts {
		ps = append(ps, p)
	}
	return ps
}

// unknown lists the owned partitions whose position is not known yet.
func (t *tracker) unknown() []int32 {
	var ps []int32
	for p, s := range t.parts {
		if s.next < 0 {
			ps = append(ps, p)
		}
	}
	return ps
}

// applied records that every record of p before next is applied. A
// position never moves back.
func (t *tracker) applied(p int32, next int64) {
	if s, ok := t.parts[p]; ok && next > s.next {
		s.next = next
	}
}

// checkpoint records that at (Redis's clock, read before the ends were
// asked for), the owned partitions ended at ends.
func (t *tracker) checkpoint(at time.Time, ends map[int32]int64) {
	for p, end := range ends {
		s, ok := t.parts[p]
		if !ok {
			continue
		}
		if n := len(s.pending); n > 0 && s.pending[n-1].end >= end {
			s.pending[n-1].at = at // nothing appended since: the later time holds
			continue
		}
		if len(s.pending) == maxPending {
			s.pending = append(s.pending[:0], s.pending[1:]...)
		}
		s.pending = append(s.pending, checkpoint{at: at, end: end})
	}
}

// caughtUp returns, for each partition that passed a checkpoint since the
// last call, the time of the latest it passed, and forgets those.
func (t *tracker) caughtUp() map[int32]time.Time {
	out := map[int32]time.Time{}
	for p, s := range t.parts {
		i := 0
		for i < len(s.pending) && s.pending[i].end <= s.next {
			i++
		}
		if i > 0 {
			out[p] = s.pending[i-1].at
			s.pending = append(s.pending[:0], s.pending[i:]...)
		}
	}
	return out
}
