package expiry

import (
	"context"
	"crypto/rand"
	"maps"
	"slices"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// brake is the mass-expiry brake. Far more sessions lapsing in a short
// window than normal (a share of the live sessions, above a floor) is more
// likely an outage nobody measured than a crowd leaving: a network
// partition between the users and us, a load balancer dropping
// connections. The lapses past the threshold are held until the grace
// after their deadlines and checked again before they are produced; a
// real crowd still gets its guides, one grace late. Later stages falling
// due while it is engaged are held too (see brakeWouldHold). Lapses are
// counted in Redis, so that replicas that share the work share the
// count. Only the pipeline goroutine uses it.
type brake struct {
	engaged bool
	holds   int // timeouts it held since engaged, for the log line that ends it
	// next is the earliest its next paced release may be (paceReleases).
	next time.Time
	// countFailing: the last count of lapses failed (braking); uncounted
	// are the counts of lapses held since, to count with the next count
	// that works.
	countFailing bool
	uncounted    []lapseCount
}

// lapseCount is n lapses found in the second sec, counted under token.
type lapseCount struct {
	sec   int64
	n     int
	token string
}

// lapseToken names a count of lapses, so that one run twice (a retry of a
// late reply, a carried count that had run) adds them once.
func lapseToken() string { return rand.Text() }

// brakeThreshold is the most lapses within the window before the brake
// engages.
func (l *Listener) brakeThreshold() int {
	share := int(l.cfg.MassExpiryShare * float64(l.marker.sessions.Load()))
	return max(l.cfg.MassExpiryFloor, share)
}

// braking counts fresh lapses, each found at its time in found (Redis's
// clock: when the read that found it ran), the batch's mark at now, and
// reports whether the batch's timeouts the brake would hold must be held.
// Each lapse is counted in the second it was found in, as every replica
// counts its own, so that two replicas sharing a crowd sum each other's
// shares however their marks and counts interleave (session.Lapses).
//
// A count that fails (Redis slow in a stall, as a crowd's big round trips
// make likely, or failing) holds them all, as if the brake were engaged,
// without engaging it: not knowing whether this is a storm, the brake
// holds each for the grace and checks it again, rather than let a crowd
// cut off from us out at once, or its later stages after it. A silence we
// could not measure costs its user the grace, never a guide while they
// were there. The lapses it could not count are counted, each in its own
// second and under its token (added once, if the count that failed ran
// after all), with the next count that works within the window after
// them (or lapseAhead, past which no count can add them), so that a crowd
// held this way still engages the brake (which then holds its later
// stages, as for any crowd), and a trickle does not.
func (l *Listener) braking(ctx context.Context, now time.Time, found []time.Time) bool {
	// The carried counts still in a window a count can sum, and this
	// batch's, a count (and its token) for each second found in.
	keep := min(l.cfg.MassExpiryWindow, session.LapseAhead)
	counts := slices.DeleteFunc(l.brake.uncounted, func(c lapseCount) bool {
		return now.Sub(time.Unix(c.sec, 0)) >= keep
	})
	l.brake.uncounted = nil
	bySec := map[int64]int{}
	for _, at := range found {
		if at.IsZero() {
			at = now
		}
		bySec[at.Unix()]++
	}
	for _, sec := range slices.Sorted(maps.Keys(bySec)) {
		counts = append(counts, lapseCount{sec: sec, n: bySec[sec], token: lapseToken()})
	}
	if len(counts) == 0 {
		counts = append(counts, lapseCount{sec: now.Unix()}) // nothing to add: the count now
	}
	count := 0
	var err error
	for _, c := range counts {
		got, cerr := l.store.Lapses(ctx, time.Unix(c.sec, 0), l.cfg.MassExpiryWindow, c.n, c.token)
		if cerr != nil {
			err = cerr
			if c.n > 0 {
				l.brake.uncounted = append(l.brake.uncounted, c) // under its token: added once, if it ran
			}
			continue
		}
		count = max(count, got)
	}
	if err != nil {
		if !l.brake.countFailing {
			l.brake.countFailing = true
			l.log.Warn("mass expiry: lapses cannot be counted; what the brake would hold is held for the grace, then checked again, until they can",
				"err", err, "grace", l.cfg.OutageGrace)
		}
		return true
	}
	if l.brake.countFailing {
		l.brake.countFailing = false
		l.log.Info("mass expiry: lapses counted again")
	}
	threshold := l.brakeThreshold()
	switch over := count > threshold; {
	case over && !l.brake.engaged:
		l.brake.engaged, l.brake.holds = true, 0
		metricBrake.Set(1)
		l.log.Warn("mass expiry: far more sessions lapsed than normal; holding them for the grace, then checking each again before it is produced",
			"lapsed", count, "window", l.cfg.MassExpiryWindow, "threshold", threshold,
			"live_sessions", l.marker.sessions.Load(), "grace", l.cfg.OutageGrace)
	case !over && l.brake.engaged:
		l.brake.engaged = false
		metricBrake.Set(0)
		l.log.Info("mass expiry over; timeouts are produced at once again",
			"held", l.brake.holds, "lapsed", count, "threshold", threshold)
	}
	return l.brake.engaged
}

// A storm the brake held is released a grace after its deadlines, which
// fall within seconds of each other: all of it at once, to a sweep that
// takes it in batches of thousands and produces each batch whole, and to
// a consumer that gets nothing for a batch's time and then all of it.
// So the brake spaces its releases, at most MassExpiryReleaseRate a
// second from this replica, in the order they fall due: the sweep then
// finds a slice at a time, the listener produces while the consumer
// sends, and a release is still never earlier than the grace after its
// deadline, each timeout checked again then, as before.

// paceReleases is the paced release of each of releases (the brake's
// verdicts, in any order): in the order they fall due, each no earlier
// than its own, nor than next, nor than gap after the one before. It
// returns them in the order given, and the earliest the next release
// may be. A gap of 0 paces nothing. next never holds the earliest of
// releases back by more than maxPaceAhead: pacing only smooths, and a
// next left far ahead (Redis's clock stepped back, a failover to a node
// behind in time) must not delay every later hold by the step.
func paceReleases(next time.Time, releases []time.Time, gap time.Duration) ([]time.Time, time.Time) {
	paced := slices.Clone(releases)
	if gap <= 0 || len(releases) == 0 {
		return paced, next
	}
	if first := slices.MinFunc(releases, time.Time.Compare); next.After(first.Add(maxPaceAhead)) {
		next = first.Add(maxPaceAhead)
	}
	order := make([]int, len(releases))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return releases[a].Compare(releases[b]) })
	for _, i := range order {
		paced[i] = later(releases[i], next)
		next = paced[i].Add(gap)
	}
	return paced, next
}

// maxPaceAhead bounds how far pacing may push a release past its
// verdict's time: 50 s is a million held timeouts at the default rate.
const maxPaceAhead = 50 * time.Second

// releaseGap is the pace of the brake's releases: 0 when not paced.
func (l *Listener) releaseGap() time.Duration {
	if l.cfg.MassExpiryReleaseRate <= 0 {
		return 0
	}
	return time.Second / time.Duration(l.cfg.MassExpiryReleaseRate)
}

// paceHolds paces the releases of the items the brake holds (see
// paceReleases), after the batch's second judgement and before its holds
// move to the hold set.
func (l *Listener) paceHolds(items []*item) {
	var held []*item
	for _, it := range items {
		if it.verdict.act == actHold && it.verdict.rule == ruleBrake {
			held = append(held, it)
		}
	}
	if len(held) == 0 {
		return
	}
	releases := make([]time.Time, len(held))
	for i, it := range held {
		releases[i] = it.verdict.release
	}
	paced, next := paceReleases(l.brake.next, releases, l.releaseGap())
	for i, it := range held {
		it.verdict.release = paced[i]
	}
	l.brake.next = next
}
