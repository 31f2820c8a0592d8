package devstack

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/guide/guidetest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// The checker's view of a user's history: after each answered ping, what
// came next decides whether its deadline was a silence.

// pingOutcome is what became of an answered ping's deadline.
type pingOutcome int

const (
	renewedInTime pingOutcome = iota // renewed or ended before the deadline: no silence
	silent                           // nothing reached Redis before the deadline: a silence
	unclear                          // a ping or close in flight at the deadline, or one whose effect is unknown
)

// outcome tells what became of answered ping k's deadline, and when the
// silence (if any) ended: at some time in [endLow, endHigh], known
// (certain) when the user's next step was answered and did renew or end
// the session. A silence never ended has endLow and endHigh far off.
func (u *invUser) outcome(k int) (o pingOutcome, endLow, endHigh time.Time, certain bool) {
	low, high := u.pings[k].deadline()
	never := u.run.end.Add(time.Hour)
	endLow, endHigh = never, never
	if k+1 < len(u.pings) {
		next := u.pings[k+1]
		endLow, certain = next.sent, next.confirmed()
		if certain {
			endHigh = next.answered
		}
	}
	for _, c := range u.closes {
		if c.sent.Before(u.pings[k].answered) || !c.sent.Before(endLow) || c.effect == closeContinues {
			continue
		}
		endLow, endHigh, certain = c.sent, never, false
		if c.effect == closeEnds {
			endHigh, certain = c.answered.Add(invEndLag), true
		}
		break
	}
	switch {
	case certain && endHigh.Before(low.Add(-invEps)):
		return renewedInTime, endLow, endHigh, certain
	case endLow.After(high.Add(invEps)):
		return silent, endLow, endHigh, certain
	}
	return unclear, endLow, endHigh, certain
}

// deferrable tells whether ping k's silence may wait for the end of its
// minute: an earlier deadline of the same minute may have been produced.
func (u *invUser) deferrable(k int) bool {
	low, high := u.pings[k].deadline()
	for j := range k {
		if u.pings[j].confirmed() {
			if o, _, _, _ := u.outcome(j); o == renewedInTime {
				continue
			}
		}
		jl, jh := u.pings[j].deadline()
		if session.DedupWindow(jh) >= session.DedupWindow(low) && session.DedupWindow(jl) <= session.DedupWindow(high) {
			return true
		}
	}
	return false
}

// match returns the answered ping whose deadline d is, or -1; unanswered
// reports whether an unanswered ping could have granted it.
func (u *invUser) match(d time.Time) (k int, unanswered bool) {
	for i, p := range u.pings {
		low, high := p.deadline()
		if d.Before(low.Add(-invEps)) || d.After(high.Add(invEps)) {
			continue
		}
		if p.confirmed() {
			return i, false
		}
		unanswered = true
	}
	return -1, unanswered
}

// invTally is the run's summary.
type invTally struct {
	pings, unanswered int
	// silences are the answered pings whose deadline passed with nothing
	// reaching Redis; checked, those whose guide the run could require.
	silences, checked, missing  int
	cameBack, inFlight, unclear int
	// backWhileHeld are silences whose user came back, and was known to,
	// while the webhook failed since before their deadline: only the
	// consumer's session check stands between them and a stale guide.
	backWhileHeld int
	// stale are silences the listener produced whose user came back
	// before the consumer sent the guide, which it then did not.
	stale                        int
	guided, unattributed         int
	twoInMinute                  int
	twoInMinuteExample           string
	minGap                       time.Duration
	minGapExample                string
	drops, unexpectedDrops       int
	seconds, lapses, leaves      int
	closeContinues, closeUnclear int
	disruptions                  map[string]int
}

// heldDownstream tells whether the webhook failed from before deadline
// to after back.
func (r *invRun) heldDownstream(deadline, back time.Time) bool {
	for _, d := range r.disruptions {
		if d.kind == disDownstream && d.start.Before(deadline) && d.end.After(back) {
			return true
		}
	}
	return false
}

// invChecker compares the guides the webhook showed with the users'
// histories.
type invChecker struct {
	r          *invRun
	tally      invTally
	violations []string
	ids        map[string]string // guide id: uid
	events     map[string][]timeoutevent.Event
	bad        []*invUser // users with a violation
}

func (c *invChecker) violate(u *invUser, format string, args ...any) {
	c.violations = append(c.violations, u.uid+": "+fmt.Sprintf(format, args...))
	if !slices.Contains(c.bad, u) {
		c.bad = append(c.bad, u)
	}
}

// check runs the checker over every user, logs the summary, and fails the
// test on a violation, or if the run did not exercise what it checks.
func (r *invRun) check() {
	t := r.t
	c := &invChecker{r: r, ids: map[string]string{}, events: r.p.events()}
	c.tally.minGap = time.Hour
	c.tally.disruptions = map[string]int{}
	for _, d := range r.disruptions {
		c.tally.disruptions[d.kind]++
	}
	for _, u := range r.users {
		c.checkUser(u)
	}
	c.logSummary()
	r.checkPromise()
	if len(c.violations) > 0 {
		const show = 25
		t.Errorf("seed %d: %d violations; the first:\n  %s", r.seed, len(c.violations),
			strings.Join(c.violations[:min(show, len(c.violations))], "\n  "))
		for _, u := range c.bad[:min(5, len(c.bad))] {
			t.Logf("%s's history:\n  %s", u.uid, strings.Join(u.notes, "\n  "))
		}
	}
	// The run must have exercised what it checks, or it proves nothing.
	tally := c.tally
	sched := r.end.Sub(r.start)
	minChecked := int(sched.Seconds())
	const minStale = 3
	switch {
	case tally.checked < minChecked:
		t.Errorf("seed %d: only %d silences checked, want at least %d", r.seed, tally.checked, minChecked)
	case tally.stale < minStale:
		// How many comebacks land between the listener's production and
		// the consumer's check is the machine's timing: on a busy host
		// the listener produces later, and more users are back before
		// it (a comeback the listener sees, which is fine). The run
		// must still take the consumer's path a few times.
		t.Errorf("seed %d: only %d silences found stale by the consumer, want at least %d", r.seed, tally.stale, minStale)
	case tally.closeContinues < 3 || tally.drops < 3 || tally.seconds < 3:
		t.Errorf("seed %d: too few device changes: %d closes with another device on, %d drops, %d second devices",
			r.seed, tally.closeContinues, tally.drops, tally.seconds)
	}
	for _, kind := range []string{disDownstream, disListener, disConsumer} {
		if sched >= 40*time.Second && tally.disruptions[kind] == 0 {
			t.Errorf("seed %d: no %s in the schedule", r.seed, kind)
		}
	}
}

func (c *invChecker) checkUser(u *invUser) {
	guides := c.r.p.hook.Guides(u.uid)
	c.tally.guided += len(guides)
	c.tally.drops += u.drops
	c.tally.unexpectedDrops += u.unexpectedDrops
	c.tally.seconds += u.secondDevices
	c.tally.lapses += u.lapses
	c.tally.leaves += u.leaves
	for _, cl := range u.closes {
		switch cl.effect {
		case closeContinues:
			c.tally.closeContinues++
		case closeUnclear:
			c.tally.closeUnclear++
		}
	}

	// Each guide: its own id, shown once, for a deadline the user was
	// granted.
	matched := map[int][]guidetest.Guide{}
	for _, g := range guides {
		if want := timeoutevent.ID(u.uid, g.Deadline.UnixMilli()); g.ID != want {
			c.violate(u, "guide id %s is not its silence's (%s)", g.ID, want)
		}
		if other, ok := c.ids[g.ID]; ok {
			c.violate(u, "guide id %s shown twice (also to %s)", g.ID, other)
		}
		c.ids[g.ID] = u.uid
		k, unanswered := u.match(g.Deadline)
		switch {
		case k >= 0:
			matched[k] = append(matched[k], g)
		case unanswered:
			c.tally.unattributed++
		default:
			c.violate(u, "guide at %s for deadline %s, which no ping of the user was granted", c.r.rel(g.At), c.r.rel(g.Deadline))
		}
	}
	for k, p := range u.pings {
		if !p.confirmed() {
			c.tally.unanswered++
			continue
		}
		c.tally.pings++
		c.checkDeadline(u, k, matched[k])
	}
	c.checkMinutes(u, guides)
	for i := 1; i < len(guides); i++ {
		if gap := guides[i].At.Sub(guides[i-1].At); gap < c.tally.minGap {
			c.tally.minGap = gap
			c.tally.minGapExample = fmt.Sprintf("%s: deadlines %s and %s, guides at %s and %s", u.uid,
				c.r.rel(guides[i-1].Deadline), c.r.rel(guides[i].Deadline), c.r.rel(guides[i-1].At), c.r.rel(guides[i].At))
		}
	}
}

// checkDeadline checks the guides gs for answered ping k's deadline:
// none unless it was a silence, and then one, by its bound, and not
// delivered after the user was known to be back.
func (c *invChecker) checkDeadline(u *invUser, k int, gs []guidetest.Guide) {
	r := c.r
	low, high := u.pings[k].deadline()
	if len(gs) > 1 {
		c.violate(u, "%d guides for the deadline in [%s, %s]", len(gs), r.rel(low), r.rel(high))
	}
	o, endLow, endHigh, certain := u.outcome(k)
	switch o {
	case renewedInTime:
		for _, g := range gs {
			c.violate(u, "guided at %s for deadline %s, though it renewed or left at [%s, %s], before the deadline",
				r.rel(g.At), r.rel(g.Deadline), r.rel(endLow), r.rel(endHigh))
		}
		return
	case unclear:
		c.tally.unclear++
		return
	}
	c.tally.silences++
	bound := r.bound(high, u.deferrable(k))
	if certain && r.heldDownstream(high, endLow) {
		c.tally.backWhileHeld++
	}
	if len(gs) == 0 {
		switch {
		case endLow.After(bound):
			c.tally.checked++
			c.tally.missing++
			c.violate(u, "silent from the deadline in [%s, %s] to %s, no guide by its bound %s",
				r.rel(low), r.rel(high), r.rel(endLow), r.rel(bound))
		case certain && c.produced(u, low, high):
			c.tally.stale++
			c.tally.cameBack++
		default:
			c.tally.cameBack++
		}
		return
	}
	g := gs[0]
	if g.At.Before(low.Add(-50 * time.Millisecond)) {
		c.violate(u, "guided at %s, before its deadline in [%s, %s]", r.rel(g.At), r.rel(low), r.rel(high))
	}
	delivered, ok := r.p.front.firstDelivered(g.ID)
	if !ok {
		delivered = g.At
	}
	if certain && delivered.After(endHigh.Add(invStaleSlack)) {
		c.violate(u, "guide for deadline %s delivered at %s, though the user renewed or left after it, confirmed by %s",
			r.rel(g.Deadline), r.rel(delivered), r.rel(endHigh))
	}
	switch {
	case !g.At.After(endLow) || endLow.After(bound):
		c.tally.checked++
		if g.At.After(bound) {
			c.violate(u, "guided at %s, %v past its bound %s (deadline in [%s, %s])",
				r.rel(g.At), g.At.Sub(bound).Round(time.Millisecond), r.rel(bound), r.rel(low), r.rel(high))
		}
	default:
		c.tally.inFlight++ // the user came back while it was on its way
	}
}

// produced tells whether the listener produced a timeout for a deadline
// in [low, high]: one with no guide, whose user came back, was found
// stale by the consumer.
func (c *invChecker) produced(u *invUser, low, high time.Time) bool {
	for _, ev := range c.events[u.uid] {
		if d := ev.Deadline(); !d.Before(low.Add(-invEps)) && !d.After(high.Add(invEps)) {
			return true
		}
	}
	return false
}

// checkMinutes checks the minute rule: of the guides for one minute's
// deadlines, one may arrive before the minute ends; the others wait for
// its end.
func (c *invChecker) checkMinutes(u *invUser, guides []guidetest.Guide) {
	byMinute := map[int64][]guidetest.Guide{}
	for _, g := range guides {
		w := session.DedupWindow(g.Deadline)
		byMinute[w] = append(byMinute[w], g)
	}
	for w, gs := range byMinute {
		if len(gs) < 2 {
			continue
		}
		c.tally.twoInMinute++
		end := session.DedupWindowEnd(gs[0].Deadline)
		if c.tally.twoInMinuteExample == "" {
			c.tally.twoInMinuteExample = fmt.Sprintf("%s: deadlines %s and %s, guides at %s and %s, the minute ending at %s",
				u.uid, c.r.rel(gs[0].Deadline), c.r.rel(gs[1].Deadline), c.r.rel(gs[0].At), c.r.rel(gs[1].At), c.r.rel(end))
		}
		early := 0
		for _, g := range gs {
			if g.At.Before(end.Add(-50 * time.Millisecond)) {
				early++
			}
		}
		if early > 1 {
			var at []string
			for _, g := range gs {
				at = append(at, c.r.rel(g.Deadline)+"→"+c.r.rel(g.At))
			}
			c.violate(u, "%d guides for deadlines of minute %d arrived before it ended at %s (deadline→arrival %v)",
				early, w, c.r.rel(end), at)
		}
	}
}

func (c *invChecker) logSummary() {
	r, tally := c.r, c.tally
	resentIDs, extraSends := r.p.front.resent()
	r.t.Logf("summary: %d users, %d answered pings (%d unanswered); %d silences: %d checked (%d missing), "+
		"%d back before their guide (%d found stale by the consumer; %d came back while the webhook failed), "+
		"%d guided while the user was coming back; %d deadlines unclear (a ping or close in flight); "+
		"%d guides (%d ids resent %d times, shown once), %d not attributable to an answered ping; "+
		"%d minutes with two guides for their deadlines; closest guides of a user %v apart; "+
		"%d lapses, %d leaves, %d drops (%d by the gateway), %d second devices, %d closes with another device on (%d unclear); disruptions %v",
		len(r.users), tally.pings, tally.unanswered, tally.silences, tally.checked, tally.missing,
		tally.cameBack, tally.stale, tally.backWhileHeld,
		tally.inFlight, tally.unclear,
		tally.guided, resentIDs, extraSends, tally.unattributed,
		tally.twoInMinute, tally.minGap.Round(time.Millisecond),
		tally.lapses, tally.leaves, tally.drops, tally.unexpectedDrops, tally.seconds, tally.closeContinues, tally.closeUnclear,
		tally.disruptions)
	var timeline []string
	for _, d := range r.disruptions {
		timeline = append(timeline, fmt.Sprintf("%s [%s, %s]", d.kind, r.rel(d.start), r.rel(d.end)))
	}
	r.t.Logf("disruptions: %s; schedule ended at %s", strings.Join(timeline, ", "), r.rel(r.end))
	if tally.twoInMinuteExample != "" {
		r.t.Logf("two guides for one minute's deadlines, e.g. %s", tally.twoInMinuteExample)
	}
	if tally.minGapExample != "" {
		r.t.Logf("closest guides: %s", tally.minGapExample)
	}
}
