package expiry

import (
	"context"
	"fmt"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// The prefetch path finds timeouts within a fire slot of their deadline,
// at about the Redis cost of a sweep every PrefetchInterval:
//
//  1. Read ahead, every PrefetchInterval, in one pipeline: per bucket
//     this replica owns (owners.go), the index entries already due and
//     those due within PrefetchAhead that were not read before, and the
//     same of the hold set (releases). The pipeline carries the sweep
//     mark after its reads, so a tick is a sweep to SweepGapMax and the
//     control state is no older than the entries read.
//  2. Arm a local timer per entry, at its due time by Redis's clock,
//     estimated from the TIME of the replies (late, never early).
//  3. Fire: the timers due are asked of Redis (Store.Confirm: dueScript,
//     as the sweep asks it, with the mark after it in one pipeline), and
//     what Redis finds due goes through emit as a swept timeout. The
//     prefetch path changes when the verdict is asked for, never what it
//     says: a renewal since the read makes Redis answer "not due", with
//     where the deadline is now, and the timer is set again if that is
//     within what was read.
//
// Deadlines written inside a window read already (a short TTL, a resync,
// a deadline moved earlier) are found by the next read's overdue part,
// within PrefetchInterval. What goes wrong makes it read again from
// scratch: an error (a lost connection, a Redis that restarted or failed
// over, whose data may differ from what was read), or a blind interval
// found by any mark. The detector is the pipeline goroutine's own; every
// timeout it finds goes through the same pipeline as the sweep's.

// prefetchLimit bounds each part of one window read: a storm is read over
// several ticks, the window's end moving to the last entry read.
const prefetchLimit = 512

// detector is the prefetch path's state: owned buckets, how far each set
// was read, the local timers, and Redis's clock.
type detector struct {
	ahead, slot time.Duration
	// fireMax bounds the timers one slot confirms, as the sweep's batch
	// bounds what one sweep takes, and at most maxFire: the rest fire in
	// the next slot, at once.
	fireMax int
	// base is the local monotonic origin of the clock estimate; off is
	// Redis's clock less the local one, in ms: never more than the truth
	// (the reply came after Redis read its clock), so timers fire late by
	// up to a round trip, never early.
	base   time.Time
	off    int64
	synced bool
	owned  [session.Buckets]bool
	// upTo and holdUpTo are how far each owned bucket's index and hold
	// set were read, in Redis ms; 0 when not yet: the next read starts at
	// now.
	upTo, holdUpTo [session.Buckets]int64
	resets         int64 // the marker's resets when last read
	timers         timers
	lastFire       time.Time
}

func newDetector(cfg Config) *detector {
	return &detector{ahead: cfg.PrefetchAhead, slot: cfg.FireSlot, fireMax: min(cfg.SweepBatch*session.Buckets, maxFire), base: time.Now()}
}

// maxFire bounds one fire: a storm's timers fall due together (a brake's
// release, a crowd leaving), and each fire confirms, claims, produces
// and settles its timeouts before the next, so the consumers get the
// first of them only once the whole slice is through. In slices of the
// sweep's bound (16,384 by default) a held storm of 40,000 reached Kafka
// in three blocks, with the consumers idle before each; in slices of
// 2,048 it flows while they send, and took less CPU (detectbench's
// storm: its last guide 0.5 s sooner).
const maxFire = 2048

// own makes owned the buckets read ahead. Timers of a bucket no longer
// owned go; a bucket newly owned is read from scratch, its overdue
// entries first.
func (d *detector) own(owned [session.Buckets]bool) {
	if owned == d.owned {
		return
	}
	for b := range owned {
		if owned[b] != d.owned[b] {
			d.upTo[b], d.holdUpTo[b] = 0, 0
		}
	}
	d.owned = owned
	d.timers.keepOnly(func(uid string) bool { return owned[session.Bucket(uid)] })
}

// reset forgets how far every set was read: the next read starts from
// scratch. The timers stay: Redis confirms each when it fires.
func (d *detector) reset() {
	clear(d.upTo[:])
	clear(d.holdUpTo[:])
}

// reads are the window reads of one tick: each owned bucket's index and
// hold set.
func (d *detector) reads() []session.WindowRead {
	var out []session.WindowRead
	for b, ok := range d.owned {
		if !ok {
			continue
		}
		out = append(out,
			session.WindowRead{Bucket: b, From: d.upTo[b], Ahead: d.ahead, Limit: prefetchLimit},
			session.WindowRead{Bucket: b, Hold: true, From: d.holdUpTo[b], Ahead: d.ahead, Limit: prefetchLimit})
	}
	return out
}

// apply arms the timers of what reads found, in replies that came at
// local time at, and moves each set's window on: to now+ahead, or, when
// the limit cut the read, to just before its last entry (its score may
// have more entries).
func (d *detector) apply(reads []session.WindowRead, wins []session.Window, at time.Time) {
	var first int64
	for i, w := range wins {
		if i == 0 || w.Now < first {
			first = w.Now
		}
		r := reads[i]
		for _, e := range w.Entries {
			d.timers.set(e.UID, e.At, r.Hold)
		}
		end := w.Now + d.ahead.Milliseconds()
		if w.Cut {
			end = w.Entries[len(w.Entries)-1].At - 1
		}
		if r.Hold {
			d.holdUpTo[r.Bucket] = end
		} else {
			d.upTo[r.Bucket] = end
		}
	}
	if len(wins) > 0 {
		d.sync(first, at)
	}
}

// sync takes Redis's clock now (ms), read in a reply that came at local
// time at.
func (d *detector) sync(now int64, at time.Time) {
	d.off = now - ceilMS(at.Sub(d.base))
	d.synced = true
}

// redisNow estimates Redis's clock at local time t, in ms.
func (d *detector) redisNow(t time.Time) int64 { return t.Sub(d.base).Milliseconds() + d.off }

func ceilMS(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// due takes the timers due at local time t, as candidates to confirm.
func (d *detector) due(t time.Time) []session.Candidate {
	if !d.synced {
		return nil
	}
	tms := d.timers.popDue(d.redisNow(t), d.fireMax)
	out := make([]session.Candidate, len(tms))
	for i, tm := range tms {
		out[i] = session.Candidate{UID: tm.uid, Held: tm.held}
	}
	return out
}

// wake is when the next slot fires: when the earliest timer is due by the
// estimate of Redis's clock, and a slot after the last one at the
// earliest.
func (d *detector) wake() (time.Time, bool) {
	at, ok := d.timers.next()
	if !ok || !d.synced {
		return time.Time{}, false
	}
	t := d.base.Add(time.Duration(at+1-d.off) * time.Millisecond)
	if soonest := d.lastFire.Add(d.slot); t.Before(soonest) {
		t = soonest
	}
	return t, true
}

// rearm sets again the timers of candidates Redis did not find due at now,
// where they are now, when that is within what was read of their set:
// otherwise the window read finds them when it gets there. One whose
// time has passed though Redis did not find it due is left to the next
// read's overdue part, so that it is asked at most once a tick.
func (d *detector) rearm(nd []session.NotDue, now int64) {
	for _, n := range nd {
		switch {
		case n.InIndex && n.Index >= now:
			d.arm(n.UID, n.Index, false)
		case n.Held && n.Release >= now:
			d.arm(n.UID, n.Release, true)
		}
	}
}

// arm sets uid's timer at at (Redis ms), if its bucket is owned and at is
// within what was read of its set (beyond, the window read finds it).
func (d *detector) arm(uid string, at int64, held bool) {
	b := session.Bucket(uid)
	end := d.upTo[b]
	if held {
		end = d.holdUpTo[b]
	}
	if d.owned[b] && at <= end {
		d.timers.set(uid, at, held)
	}
}

func (d *detector) ownedCount() int {
	n := 0
	for _, ok := range d.owned {
		if ok {
			n++
		}
	}
	return n
}

// The I/O shell: each runs on the pipeline goroutine.

// readAhead is one tick of the prefetch path: decide the owned buckets,
// read their windows with the sweep mark, arm the timers.
func (l *Listener) readAhead(ctx context.Context) {
	d := l.detect
	defer func() {
		metricOwnedBuckets.Set(float64(d.ownedCount()))
		metricTimers.Set(float64(d.timers.len()))
	}()
	if l.pausedBySpool() || l.standby() {
		// Another replica takes the work, or the spool drains first:
		// as the sweep, this replica finds nothing meanwhile.
		d.own([session.Buckets]bool{})
		return
	}
	var others []string
	if c, ok := l.marker.current(); ok {
		others = replicasAlive(l.marker.id, c, l.listenerFresh())
	}
	d.own(ownedBuckets(l.marker.id, l.marker.canProduce(), others))
	if r := l.marker.resets.Load(); r != d.resets {
		d.resets = r
		d.reset()
	}
	reads := d.reads()
	if len(reads) == 0 {
		return
	}
	var wins []session.Window
	var at time.Time
	c, readErr, markErr := l.withMark(ctx, func(ctx context.Context, m *session.SweepMark) (session.Marked, error) {
		w, marked, err := l.store.Prefetch(ctx, reads, m)
		wins, at = w, time.Now()
		return marked, err
	})
	if readErr != nil {
		l.sweepDown.Fail(readErr)
		// A lost connection, a Redis that restarted: what was read may
		// be out of date.
		d.reset()
		return
	}
	d.apply(reads, wins, at)
	if markErr != nil {
		l.sweepDown.Fail(markErr)
		return
	}
	l.sweepDown.OK()
	if l.brake.engaged {
		// As the sweep does when nothing is due: the brake lets go once
		// the lapses in its window are few again.
		l.braking(ctx, c.Now, nil)
	}
}

// fire confirms the timers due now and emits the timeouts Redis finds due.
func (l *Listener) fire(ctx context.Context) {
	d := l.detect
	d.lastFire = time.Now()
	if l.pausedBySpool() || l.standby() {
		d.own([session.Buckets]bool{})
		return
	}
	cands := d.due(d.lastFire)
	if len(cands) == 0 {
		return
	}
	metricConfirms.Add(float64(len(cands)))
	defer func() { metricFireSeconds.Observe(time.Since(d.lastFire).Seconds()) }()
	var conf session.Confirmed
	var at time.Time
	c, confErr, markErr := l.withMark(ctx, func(ctx context.Context, m *session.SweepMark) (session.Marked, error) {
		got, marked, err := l.store.Confirm(ctx, cands, m)
		conf, at = got, time.Now()
		return marked, err
	})
	metricTimers.Set(float64(d.timers.len()))
	if confErr != nil {
		// Still in the index or the hold set: the next read's overdue
		// part finds them.
		l.sweepDown.Fail(confErr)
		return
	}
	d.sync(conf.Now, at)
	metricNotDue.Add(float64(len(conf.NotDue)))
	d.rearm(conf.NotDue, conf.Now)
	metricTimers.Set(float64(d.timers.len()))
	if markErr != nil {
		// No control state to judge them by: they stay in the index, for
		// the next read's overdue part.
		l.sweepDown.Fail(markErr)
		return
	}
	l.sweepDown.OK()
	if len(conf.Due) == 0 {
		return
	}
	metricSeen.WithLabelValues(timeoutevent.SourceSweep).Add(float64(len(conf.Due)))
	if _, err := l.emit(ctx, c, conf.Due, timeoutevent.SourceSweep); err != nil {
		l.sweepDown.Fail(fmt.Errorf("emit %d timeouts found by their timers: %w", len(conf.Due), err))
	}
}

// withMark runs reads, a pipeline of the prefetch path, with the sweep
// mark after them: in the same pipeline while the reads succeed, else in
// a round trip of its own once they do, so that a failing read (a slot of
// a cluster, say) is not hidden by a mark made beside it, and its gap
// shows. A read that fails stops the marks between sweeps too, as a
// failing sweep does (marker.sweepsOK).
func (l *Listener) withMark(ctx context.Context, reads func(context.Context, *session.SweepMark) (session.Marked, error)) (c session.Control, readErr, markErr error) {
	start := time.Now()
	if l.marker.sweepsOK.Load() {
		c, markErr = l.marker.markVia(ctx, func(ctx context.Context, m session.SweepMark) (session.Control, error) {
			marked, err := reads(ctx, &m)
			readErr = err
			return marked.Control, marked.Err
		})
		if readErr == nil && markErr == nil && time.Since(start) > stallMin {
			// Reads that stalled (see stall.go): the mark that rode
			// with them may have answered, on another master, before
			// they hung, so Redis's time in it says nothing of when
			// they ended. Marked again, after them.
			c, markErr = l.marker.mark(ctx)
		}
	} else {
		_, readErr = reads(ctx, nil)
		if readErr == nil {
			c, markErr = l.marker.mark(ctx)
		}
	}
	l.marker.sweepsOK.Store(readErr == nil)
	return c, readErr, markErr
}

// armWritten sets timers for what this listener wrote itself: the next
// stages of settled timeouts, and holds. Beyond what was read of their
// sets, the window reads find them. (A hold a renewal or an end cancels
// is recorded in the user's timeline by the script that cancels it, see
// session.HoldNotes: not by this replica, which may have restarted by
// then, or whose read-ahead path may be off.)
func (l *Listener) armWritten(es []session.Expired, at func(session.Expired) time.Time, held bool) {
	if l.detect == nil {
		return
	}
	for _, e := range es {
		t := at(e)
		if t.IsZero() || !t.Before(session.AfterReplay) {
			continue
		}
		l.detect.arm(e.UID, t.UnixMilli(), held)
	}
}
