package expiry

import (
	"slices"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// A silence we caused is not a silence. A timeout whose deadline fell in a
// time in which its user could not reach us, or within the grace after
// it, is held: it waits until the grace after that time has passed, and is
// then checked again, so that a user who was there has pinged by then and
// is never guided. The rules, all by Redis's clock:
//
//   - A blind interval of everyone (no sweep, Redis data lost, a clock
//     step, the whole gateway fleet down) or of the user's gateway (its
//     renewals failed, its heartbeat had a gap) holds a deadline in
//     [start, end+grace] until end+grace. One of the activity feed's lag
//     holds it, past end+grace, until the feed's watermark has passed
//     end+grace as well: the platform's records of the outage, buffered
//     and appended after it, may reach the topic up to then, and are
//     judged only once applied. It is held again as the watermark rule
//     below holds (as long again as the feed lags, within bounds).
//   - The rules about a gateway apply to every instance of the user: the
//     one whose grant the deadline is, the one that renewed last, and
//     every one with a connection of theirs (a route entry another
//     instance may drop once it is dead, while its clients still ping it).
//   - A gateway instance that is dead now, or missed a heartbeat (one a
//     third of its lease), holds its users' deadlines in [last
//     heartbeat-lease, last heartbeat+grace] until last heartbeat+grace:
//     a user who was there has reconnected to another instance and pinged
//     by then (a client leaves an instance that does not answer its ping
//     within its pong timeout, a quarter of the TTL by default: one frozen
//     or cut off keeps its connections open). A missed heartbeat is
//     enough, so that an instance cut from Redis is known before the
//     first deadline its users could not renew falls due, as long as the
//     clients' margin (the shortest TTL less their ping period) is above
//     gateway.PingMargin: a heartbeat interval and session.BeatSlack for
//     the miss to show, and the gateway's stall bound (and a quarter of
//     it) for a renewal that died with it unwritten. A thinner margin is
//     outside what this rule covers: such a user, whose instance died
//     within it, is judged before the miss shows.
//   - While no gateway instance is alive at all, every deadline since the
//     last one was seen alive is held, until the grace after one is back.
//   - Where the platform's servers feed activity through the activity
//     topic, a deadline at or past the feed's watermark (the time before
//     which every partition had been applied) may have been renewed by a
//     record still unread: it is held until the stamp that can move the
//     watermark past it has landed, then checked again (activityRelease).
//     A feed that lagged longer than its gap records a blind interval (the
//     first rule).

// outageFinding is the latest hold an outage rule puts a timeout on: its release
// time (zero: no outage rule holds it), its rule, and what the rule found.
type outageFinding struct {
	release time.Time
	rule    holdRule
	blind   session.BlindInterval // ruleBlind: the blind interval that holds it
	via     string                // ruleGatewayDead: the gateway instance that missed a heartbeat
}

// outageHold returns the latest hold an outage rule puts e's timeout on;
// a zero release when no outage rule holds it. Every gateway instance of
// the user counts: the one that renewed last, and every one with a
// connection of theirs, since a user is present while any of their
// devices pings.
func outageHold(c session.Control, e session.Expired, grace time.Duration) outageFinding {
	var o outageFinding
	holdTo := func(t time.Time, rule holdRule, blind session.BlindInterval, via string) {
		if t.After(c.Now) && t.After(o.release) {
			o = outageFinding{release: t, rule: rule, blind: blind, via: via}
		}
	}
	// The stage's due time: for stage 1 the deadline; for a later stage,
	// a ping in an outage before it would have ended the silence.
	d := e.Due
	instances := append(e.Vias(), e.Routes...)
	for _, b := range c.Blind {
		if b.Scope != "" && !slices.Contains(instances, b.Scope) {
			continue
		}
		// A stall of this replica's own holds only what fell due in
		// it, for stallSettle (see stall.go).
		g, reach := grace, grace
		if b.Reason == session.BlindReadStall {
			g, reach = min(stallSettle, grace), 0
		}
		if !d.Before(b.Start) && !d.After(b.End.Add(reach)) {
			holdTo(b.End.Add(g), ruleBlind, b, "")
			// The feed's lag: the platform's records of it, appended up
			// to the grace after it, must have been applied too.
			if w, fed := c.ActivityWatermark(); fed && b.Reason == session.BlindActivityLag && w.Before(b.End.Add(grace)) {
				holdTo(c.Now.Add(min(max(c.Now.Sub(w), activityRecheck), grace)), ruleBlind, b, "")
			}
		}
	}
	for _, name := range instances {
		inst, ok := c.Instances[name]
		if !ok || !inst.MissedBeat(c.Now) {
			continue
		}
		if !d.Before(inst.Last.Add(-inst.Lease)) && !d.After(inst.Last.Add(grace)) {
			holdTo(inst.Last.Add(grace), ruleGatewayDead, session.BlindInterval{}, name)
		}
	}
	if since, down := fleetDown(c); down && !d.Before(since) {
		holdTo(c.Now.Add(grace), ruleFleetDown, session.BlindInterval{}, "")
	}
	if w, fed := c.ActivityWatermark(); fed && !d.Before(w) {
		holdTo(activityRelease(c.Now, w, d, c.ActivityStamp, grace), ruleActivityLag, session.BlindInterval{}, "")
	}
	return o
}

// activityRelease is when a deadline d at or past the activity feed's
// watermark w is checked again, at now, the feed's members stamping every
// stamp (0: not known).
//
// On its cadence, the feed's member reads the time T (Redis's clock) and
// the partitions' ends once a stamp, and writes T as a partition's time
// once it has applied the partition up to its end then. w is such a T, so
// the member's next stamps start at w+stamp, w+2*stamp, ...; the one at
// w+j*stamp moves the watermark to its own time when its partition was
// caught up by then, or only to the stamp before when records were still
// arriving (it is written with the next). The hold ends stampSlack after
// the first stamp that can move the watermark past d, and no sooner than
// holdFloor from now: one hold per silence, not a recheck every few ms. A
// stamp that has landed without moving w (now more than a stamp and the
// slack past it) says the partition trails by a stamp: the one after
// then.
//
// A feed that lags more than two stamps is off its cadence (a member
// stalled, Kafka down): the deadline is held as long again as the feed
// lags, at least activityRecheck, so that a stall does not make every
// held deadline recheck every few ms. So is every deadline while the
// stamp is not known (members that predate it). Never longer than the
// grace.
func activityRelease(now, w, d time.Time, stamp, grace time.Duration) time.Time {
	lag := now.Sub(w)
	if stamp <= 0 || lag >= 2*stamp+stampSlack {
		return now.Add(min(max(lag, activityRecheck), grace))
	}
	var behind int64
	if lag >= stamp+stampSlack {
		behind = 1
	}
	// The first stamp whose time, less a stamp if behind, is past d.
	j := int64(d.Sub(w)/stamp) + 1 + behind
	release := w.Add(time.Duration(j)*stamp + stampSlack)
	if floor := now.Add(holdFloor); release.Before(floor) {
		release = floor
	}
	if limit := now.Add(grace); release.After(limit) {
		release = limit
	}
	return release
}

// activityLag is how far the activity feed's watermark trails Redis's
// clock in c: 0 without a feed, or one ahead.
func activityLag(c session.Control) time.Duration {
	w, fed := c.ActivityWatermark()
	if !fed {
		return 0
	}
	return max(c.Now.Sub(w), 0)
}

// activityRecheck is the shortest hold for a deadline past the watermark
// of an activity feed off its cadence, or whose stamp is not known.
const activityRecheck = 100 * time.Millisecond

// stampSlack is how long after its time a stamp of the activity feed is
// taken to have landed: after reading Redis's clock, its member asks
// Kafka for the partitions' ends and runs a script in Redis, tens of ms
// on a busy host.
const stampSlack = 50 * time.Millisecond

// holdFloor is the shortest hold for a deadline past the watermark of an
// activity feed on its cadence, for a stamp due to land any moment: one
// later than that is waited for a stamp longer (activityRelease).
const holdFloor = 25 * time.Millisecond

// fleetDown reports whether gateway instances are known and none is alive,
// and since when: the last heartbeat of the newest, less its lease.
func fleetDown(c session.Control) (time.Time, bool) {
	if len(c.Instances) == 0 {
		return time.Time{}, false
	}
	var since time.Time
	for _, inst := range c.Instances {
		if inst.AliveAt(c.Now) {
			return time.Time{}, false
		}
		if t := inst.Last.Add(-inst.Lease); t.After(since) {
			since = t
		}
	}
	return since, true
}
