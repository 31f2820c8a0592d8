package promise

import (
	"cmp"
	"slices"
	"time"
)

// Class is what became of one stage of one silence, or of a delivery
// that belongs to none.
type Class string

const (
	OK            Class = "ok"            // delivered once, in order, within its bound; or rightly not at all
	Late          Class = "late"          // delivered once, past its bound
	Lost          Class = "lost"          // due, and never delivered though the run went on past its bound
	False         Class = "false"         // delivered to a user whose answered signals had superseded it, or before its deadline
	Duplicated    Class = "duplicated"    // two guides for it, or one id twice on a device
	Disordered    Class = "disordered"    // a later stage before the one before it, or sooner than its delay
	Indeterminate Class = "indeterminate" // depends on a signal whose outcome is unknown
	Spam          Class = "spam"          // delivered to a user who kept trying to reach us through a fault
	Pending       Class = "pending"       // its bound is past the history's end
)

// Failure reports whether c breaks the promise.
func (c Class) Failure() bool {
	switch c {
	case Lost, False, Duplicated, Disordered, Spam:
		return true
	}
	return false
}

// Verdict is the class of one stage of one silence (or of a delivery
// that matches none), and why.
type Verdict struct {
	UID      string
	Deadline time.Time // the silence's (stage 1's) deadline; a stray delivery's named one
	Stage    int
	Due      time.Time // the earliest this stage could fall due
	Bound    time.Time // the latest it may be delivered and be on time
	Class    Class
	// Delivered: a sink saw it; Lateness is its first delivery past Due.
	Delivered bool
	Lateness  time.Duration
	// Faults are the kinds of fault windows the stage met.
	Faults []string
	Why    string
}

// Check classifies every stage of every silence in h.
func Check(cfg Config, h History) []Verdict {
	signals := map[string][]Signal{}
	for _, s := range h.Signals {
		signals[s.UID] = append(signals[s.UID], s)
	}
	deliveries := map[string][]Delivery{}
	for _, d := range h.Deliveries {
		deliveries[d.UID] = append(deliveries[d.UID], d)
	}
	uids := make([]string, 0, len(signals)+len(deliveries))
	for uid := range signals {
		uids = append(uids, uid)
	}
	for uid := range deliveries {
		if _, ok := signals[uid]; !ok {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	var out []Verdict
	for _, uid := range uids {
		u := user{cfg: cfg, h: h, uid: uid, signals: signals[uid], deliveries: deliveries[uid]}
		out = append(out, u.check()...)
	}
	return out
}

// user checks one user's history.
type user struct {
	cfg        Config
	h          History
	uid        string
	signals    []Signal // by Sent
	deliveries []Delivery
}

// silence is a deadline the user's answered signals let pass: prev set
// it, next (nil at the history's end) came after.
type silence struct {
	deadline time.Time
	// moved is the deadline unanswered signals would have moved it to
	// (zero: none): a delivery may name either.
	moved      time.Time
	prev, next *Signal
	matched    map[int][]Delivery
}

func (u *user) check() []Verdict {
	slices.SortStableFunc(u.signals, func(a, b Signal) int { return a.Sent.Compare(b.Sent) })
	silences := u.silences()
	for _, s := range silences {
		after := time.Time{}
		if s.prev != nil {
			after = s.prev.Sent
		}
		s.moved = u.doubtOf(after, s.deadline).until
	}
	var stray []Delivery
	for _, d := range u.deliveries {
		if s := cmp.Or(u.match(silences, d.Deadline), u.within(silences, d)); s != nil {
			s.matched[d.Stage] = append(s.matched[d.Stage], d)
		} else {
			stray = append(stray, d)
		}
	}
	var out []Verdict
	windows := map[[2]int64]time.Time{} // (stage, window) taken by an earlier silence, until (see stages)
	for _, s := range silences {
		out = append(out, u.stages(s, windows)...)
	}
	// A stray guide seen on several sinks, or repeated, is one verdict:
	// the deliveries of one stage naming one deadline (within Match).
	var groups [][]Delivery
	for _, d := range stray {
		i := slices.IndexFunc(groups, func(g []Delivery) bool {
			return g[0].Stage == d.Stage && g[0].Deadline.Sub(d.Deadline).Abs() <= u.cfg.Match
		})
		if i < 0 {
			groups = append(groups, []Delivery{d})
		} else {
			groups[i] = append(groups[i], d)
		}
	}
	for _, g := range groups {
		slices.SortStableFunc(g, func(a, b Delivery) int { return a.At.Compare(b.At) })
		out = append(out, u.stray(g[0]))
	}
	return out
}

// silences walks the answered signals in the order sent and returns each
// deadline that passed before the next.
func (u *user) silences() []*silence {
	var out []*silence
	var (
		active, held bool // a session runs; a turn to us holds its clock
		deadline     time.Time
		setBy        *Signal
	)
	for i := range u.signals {
		s := &u.signals[i]
		if s.Outcome != Answered {
			continue
		}
		// It landed between its send and its answer: a silence, when it
		// may have landed after the deadline.
		if active && !held && s.known().After(deadline.Add(-u.cfg.InFlight)) {
			out = append(out, &silence{deadline: deadline, prev: setBy, next: s, matched: map[int][]Delivery{}})
			active = false
		}
		switch s.Kind {
		case Ping:
			if !active || (!held && s.Deadline.After(deadline)) {
				deadline, setBy = s.Deadline, s
			}
			if !active {
				held = false
			}
			active = true
		case TurnToUser:
			active, held, deadline, setBy = true, false, s.Deadline, s
		case TurnToUs:
			active, held, deadline, setBy = true, s.Deadline.IsZero(), s.Deadline, s
		case End:
			active = false
		}
	}
	if active && !held && deadline.Before(u.h.End) {
		out = append(out, &silence{deadline: deadline, prev: setBy, matched: map[int][]Delivery{}})
	}
	return out
}

// match is the silence whose deadline is nearest to named, within Match;
// or whose deadline unanswered signals moved (see silence.moved) to as
// much as the grace before named: one without an answer may have landed
// late, held in the service while its store was out of reach, and its
// deadline counts from then (see landedLate). One sent before the silence
// began may so land in it too (see heldInto).
//
// A silence never takes a guide naming a deadline at or after the one the
// signal that ended it granted: the session lapsed there only once that
// signal had landed, in a later silence (a ping without an answer, held
// in a frozen gateway, that lands after the user's return moves the next
// silence's deadline, not this one's).
func (u *user) match(silences []*silence, named time.Time) *silence {
	var best *silence
	var bestGap time.Duration
	for _, s := range silences {
		if s.next != nil && !s.next.Deadline.IsZero() && !named.Before(s.next.Deadline) {
			continue
		}
		for _, d := range []time.Time{s.deadline, s.moved} {
			if d.IsZero() {
				continue
			}
			gap := d.Sub(named).Abs()
			if d.Equal(s.moved) && u.landedLate(d, named) || d.Equal(s.deadline) && u.heldInto(s, named) {
				gap = min(gap, u.cfg.Match) // the farthest an exact match may be
			}
			if gap <= u.cfg.Match && (best == nil || gap < bestGap) {
				best, bestGap = s, gap
			}
		}
	}
	return best
}

// within finds the silence a delivery d that names no silence's deadline
// came in, when the deadline it names is earlier than that silence's and
// no earlier than the answered signal that set it: the service lost the
// later deadline (a Redis master restarted without its data, and a renewal
// after it counted from its own time) and took the silence to run out
// sooner. Judged as that silence's, it is right once the silence's own
// deadline passed, and false before. One delivered after the user came
// back is not within it.
func (u *user) within(silences []*silence, d Delivery) *silence {
	for _, s := range silences {
		if s.prev == nil || d.Deadline.Before(s.prev.Sent) || !d.Deadline.Before(s.deadline) {
			continue
		}
		if s.next != nil && !d.At.Before(s.next.Sent) {
			continue
		}
		return s
	}
	return nil
}

// heldInto reports whether a guide naming named, at or after s's
// deadline, may be of s because a signal without an answer sent before
// s's deadline landed late (see landedLate), after the answered signals
// that set it, and moved it to named.
func (u *user) heldInto(s *silence, named time.Time) bool {
	if named.Before(s.deadline) {
		return false
	}
	for _, x := range u.signals {
		if !x.Sent.Before(s.deadline) {
			break // sorted by Sent
		}
		if x.Outcome != Answered && !x.Deadline.IsZero() && u.landedLate(x.Deadline, named) {
			return true
		}
	}
	return false
}

// landedLate reports whether a guide naming named may be of the deadline
// moved that unanswered signals would have set, had one landed late: up
// to the grace after it.
func (u *user) landedLate(moved, named time.Time) bool {
	return !moved.IsZero() && !named.Before(moved) && !named.After(moved.Add(u.cfg.Grace+u.cfg.Match))
}

// doubt is what the unanswered signals say of a stage falling due at
// due: the latest deadline they would have set, and whether they show a
// user who kept trying (a refusal, or two or more tries without an
// answer) rather than one try in doubt.
type doubt struct {
	until time.Time // zero: no unanswered signal bears on it
	kept  bool
	// ending: an unanswered End (the conversation may be over), or an
	// unanswered turn that would have set an earlier deadline (the
	// silence may have been that one, not this).
	ending bool
	count  int
}

// unansweredWithin reports whether a signal without an answer was sent
// in [from, to]. Landed, it ended the silence, as an answered one would:
// a stage due before it and not yet delivered is then rightly dropped
// (the service finds it stale), and not landed, it was owed.
func (u *user) unansweredWithin(from, to time.Time) bool {
	for _, s := range u.signals {
		if s.Outcome == NoAnswer && !s.Sent.Before(from) && !s.Sent.After(to) {
			return true
		}
	}
	return false
}

// doubtOf follows the unanswered signals sent after `after` and before
// due (less InFlight), each extending due to the deadline it would have
// set, until none more does. Signals sent within InFlight of each other
// are one try: two devices cut by one gateway's fault did not keep
// trying.
func (u *user) doubtOf(after, due time.Time) doubt {
	var d doubt
	refused := false
	tries := 0
	var lastTry time.Time
	for _, s := range u.signals {
		if s.Outcome == Answered || !s.Sent.After(after) {
			continue
		}
		if !s.Sent.Before(due.Add(-u.cfg.InFlight)) {
			break // sorted by Sent
		}
		d.count++
		if tries == 0 || s.Sent.Sub(lastTry) > u.cfg.InFlight {
			tries, lastTry = tries+1, s.Sent
		}
		refused = refused || s.Outcome == Refused
		switch {
		case s.Kind == End:
			d.ending = true
		case s.Deadline.IsZero(): // a turn to us without max_ms: held for good
			d.until = u.h.End.Add(time.Hour)
		case s.Deadline.After(due):
			due = s.Deadline
		case s.Kind != Ping && s.Deadline.Before(due.Add(-u.cfg.Match)):
			d.ending = true // a turn replaces the deadline, shorter too
		}
		d.until = later(d.until, due)
	}
	d.kept = refused || tries >= 2
	return d
}

// stages judges each stage of s. Stage 1 falls due at the deadline (or
// later, when unanswered signals would have moved it); stage k+1 its
// delay after stage k, counted from when stage k was detected, which lies
// between its due time and its first delivery. A stage is due only once
// the one before it was delivered: the service schedules the next on
// producing one.
func (u *user) stages(s *silence, windows map[[2]int64]time.Time) []Verdict {
	var out []Verdict
	judged := map[int]bool{}
	after := time.Time{}
	if s.prev != nil {
		after = s.prev.Sent
	}
	base := s.deadline // stage 1's due time, moved by doubt
	var prevDue, prevFirst time.Time
	var lastJudged int
	inDoubt := false // a stage before was indeterminate
	for stage := 1; stage <= len(u.cfg.Delays)+1; stage++ {
		got := s.matched[stage]
		slices.SortStableFunc(got, func(a, b Delivery) int { return a.At.Compare(b.At) })
		due, latest := base, base
		if stage > 1 {
			delay := u.cfg.Delays[stage-2]
			due, latest = earlier(prevDue, prevFirst).Add(delay), later(prevDue, prevFirst).Add(delay)
			after = s.deadline
		}
		clear, clearLatest := due, latest // the stage as if no unanswered signal landed
		dbt := u.doubtOf(after, due)
		if !dbt.until.IsZero() {
			due, latest = later(due, dbt.until), later(latest, dbt.until)
			// An unanswered signal that landed late set the deadline the
			// guide names, past the one it would have set.
			if stage == 1 && len(got) > 0 && u.landedLate(dbt.until, got[0].Deadline) {
				due, latest = later(due, got[0].Deadline), later(latest, got[0].Deadline)
			}
		}
		// So may one sent before the silence began, landing after the
		// signals that set its deadline.
		if stage == 1 && len(got) > 0 && u.heldInto(s, got[0].Deadline) {
			due, latest = later(due, got[0].Deadline), later(latest, got[0].Deadline)
		}
		if stage == 1 {
			base, latest = due, due
		}
		v := Verdict{UID: u.uid, Deadline: s.deadline, Stage: stage, Due: due, Delivered: len(got) > 0}
		v.Bound, v.Faults = u.bound(stage, due, latest, windows)
		judged[stage] = true
		// The user's next answered signal, if any, decides whether the
		// stage was due: back before it could fall due, it was not;
		// back while it fell due, either way is right; back after, it
		// was. Whichever, a guide first tried after the user was known
		// back is one to someone present, and two guides are two.
		inFlight := u.cfg.InFlight
		before := s.next != nil && s.next.known().Before(due.Add(-inFlight))
		raced := s.next != nil && !before && s.next.Sent.Before(latest.Add(inFlight))
		stale := s.next != nil && len(got) > 0 && got[0].tried().After(s.next.known().Add(cmp.Or(u.cfg.Stale, inFlight)))
		switch {
		case stale:
			v.Class, v.Lateness, v.Why = False, got[0].At.Sub(due), "delivered after the user came back"
		case before && len(got) == 0 && dbt.count > 0 && s.next.Sent.After(u.clearBound(stage, clear, clearLatest)):
			v.Class, v.Why = Indeterminate, "not delivered; the user came back before it fell due if a signal without an answer landed, past its bound if none did"
		case before && len(got) == 0:
			v.Class, v.Why = OK, "the user came back before it fell due"
		case (raced || dbt.count > 0) && duplicated(got):
			v.Class, v.Lateness, v.Why = Duplicated, got[0].At.Sub(due), "delivered more than once, whichever way its doubt goes"
		case raced:
			v.Class, v.Why = OK, "raced by a signal sent within the in-flight slack of its due time: either way is right"
		case before && dbt.count > 0:
			v.Class, v.Why = u.doubtful(dbt, "delivered though the user came back")
		case before:
			v.Class, v.Why = False, "delivered though the user came back before it fell due"
		case s.next != nil && len(got) == 0 && !s.next.Sent.After(v.Bound):
			v.Class, v.Why = OK, "the user came back before its bound: not delivered is right"
		case len(got) == 0 && u.unansweredWithin(due.Add(-inFlight), v.Bound):
			v.Class, v.Why = Indeterminate, "not delivered; a signal without an answer, sent once it fell due and before its bound, may have brought the user back"
		case inDoubt && len(got) == 0:
			v.Class, v.Why = Indeterminate, "not delivered, after a stage whose silence was in doubt"
		default:
			v.Class, v.Lateness, v.Why = u.judge(stage, got, due, v.Bound, prevFirst, dbt)
		}
		// The minute rule defers a later silence only behind a guide that
		// may have gone out. One that went out, or may have, takes its
		// window for good. One that fell due and was rightly left
		// undelivered (the user came back) may have been produced and not
		// yet found stale, until its bound: the service takes the window
		// when it produces, and frees it once the consumer finds the user
		// back, which a downstream that fails puts off (the consumer holds
		// the record until it answers again). Not one whose user came back
		// before it fell due.
		//
		// The service keys a stage's window on when it really fell due,
		// anywhere from due to latest (a later stage counts its delay from
		// when the one before was detected): it may have taken any window
		// of that stretch, and not after its first delivery (give or take
		// the clocks' difference).
		if u.cfg.Window > 0 && !(before && len(got) == 0) {
			took := latest
			if len(got) > 0 {
				took = earlier(took, got[0].At.Add(u.cfg.Match))
			}
			until := forever
			if v.Class == OK && len(got) == 0 {
				until = v.Bound
			}
			for _, k := range u.windowKeys(stage, due, took) {
				windows[k] = later(windows[k], until)
			}
		}
		inDoubt = inDoubt || v.Class == Indeterminate
		out = append(out, v)
		if before || raced || len(got) == 0 {
			lastJudged = stage
			break
		}
		prevDue, prevFirst = due, got[0].At
	}
	// Deliveries of stages that were not due: after the user came back,
	// or after a stage that was never delivered.
	for stage, got := range s.matched {
		if judged[stage] || len(got) == 0 {
			continue
		}
		v := Verdict{UID: u.uid, Deadline: s.deadline, Stage: stage, Due: got[0].At, Bound: got[0].At, Delivered: true,
			Class: Disordered, Why: "delivered though the stage before it was not"}
		if s.next != nil && s.next.Sent.Before(got[0].At) && stage > lastJudged {
			v.Class, v.Why = False, "delivered though the user came back before it fell due"
		}
		if stage < 1 || stage > len(u.cfg.Delays)+1 {
			v.Class, v.Why = False, "a stage the service does not have"
		}
		out = append(out, v)
	}
	slices.SortStableFunc(out, func(a, b Verdict) int { return cmp.Compare(a.Stage, b.Stage) })
	return out
}

// doubtful classifies a stage delivered while unanswered signals said the
// user may have been there: spam when they kept trying, else
// indeterminate.
func (u *user) doubtful(d doubt, what string) (Class, string) {
	if d.kept {
		return Spam, what + " while the user kept trying to reach us (refused, or unanswered more than once)"
	}
	return Indeterminate, what + " while a signal without an answer may have renewed the session"
}

// judge classifies a stage that fell due, from its deliveries.
func (u *user) judge(stage int, got []Delivery, due, bound, prevFirst time.Time, dbt doubt) (Class, time.Duration, string) {
	if len(got) == 0 {
		switch {
		case dbt.ending:
			return Indeterminate, 0, "not delivered; an End or a turn without an answer may have ended the conversation or moved its deadline"
		case bound.After(u.h.End):
			return Pending, 0, "not delivered yet; its bound is past the history's end"
		}
		return Lost, 0, "never delivered"
	}
	first := got[0]
	lateness := first.At.Sub(due)
	switch {
	case first.At.Before(due.Add(-u.cfg.InFlight)):
		if dbt.count > 0 {
			c, why := u.doubtful(dbt, "delivered before the deadline its unanswered signals would have set")
			return c, lateness, why
		}
		if stage > 1 {
			return Disordered, lateness, "delivered sooner than its delay after the stage before it"
		}
		return False, lateness, "delivered before its deadline, while the user was there"
	case dbt.ending:
		return Indeterminate, lateness, "delivered; an End or a turn without an answer may have ended the conversation or moved its deadline"
	case duplicated(got):
		return Duplicated, lateness, "delivered more than once"
	case stage > 1 && (prevFirst.IsZero() || first.At.Before(prevFirst)):
		return Disordered, lateness, "delivered before the stage before it"
	}
	// Signals without an answer sent after it fell due and before the
	// guide was tried (a return through a fault): if they would have kept
	// the user until past the guide, it went to someone who was there.
	if back := u.doubtOf(due, first.tried()); back.until.After(first.tried()) {
		c, why := u.doubtful(back, "first tried after the user came back")
		return c, lateness, why
	}
	switch {
	case first.At.After(bound):
		return Late, lateness, "delivered past its bound"
	}
	return OK, lateness, "delivered once, within its bound"
}

// tried is when the sender first tried d.
func (d Delivery) tried() time.Time {
	if d.Sent.IsZero() {
		return d.At
	}
	return d.Sent
}

// duplicated: two ids, or one id twice on a sink that shows each.
func duplicated(got []Delivery) bool {
	seen := map[[2]string]bool{}
	for _, d := range got {
		if d.ID != got[0].ID {
			return true
		}
		k := [2]string{d.Sink, d.ID}
		if seen[k] && !d.Idempotent {
			return true
		}
		seen[k] = true
	}
	return false
}

// bound is the latest a stage due at due (at the latest at latest) may be
// delivered. Under the minute rule a second silence of the stage within
// one window may wait for the window's end (an earlier silence marks
// every window it may have taken: see stages). From then, a fault it met
// (it fell due before the fault's grace ran out, and its bound had not
// passed when the fault began) moves it to the grace after the later of
// the two, again until no fault moves it; then Slack.
func (u *user) bound(stage int, due, latest time.Time, windows map[[2]int64]time.Time) (time.Time, []string) {
	start := latest
	if k := u.windowKey(stage, due); u.cfg.Window > 0 && !windows[k].IsZero() && !due.After(windows[k]) {
		start = later(start, time.Unix(0, (k[1]+1)*int64(u.cfg.Window)))
	}
	b := start
	var kinds []string
	for moved := true; moved; {
		moved = false
		for _, f := range u.h.Faults {
			grace := cmp.Or(f.Grace, u.cfg.Grace)
			if f.Start.After(b.Add(u.cfg.Slack)) || start.After(f.End.Add(grace)) {
				continue
			}
			if !slices.Contains(kinds, f.Kind) {
				kinds = append(kinds, f.Kind)
			}
			if nb := later(start, f.End).Add(grace); nb.After(b) {
				b, moved = nb, true
			}
		}
	}
	slices.Sort(kinds)
	return b.Add(u.cfg.Slack), kinds
}

// forever is a window taken for good.
var forever = time.Unix(1<<40, 0)

// windowKey is the minute rule's window of a stage due at due.
func (u *user) windowKey(stage int, due time.Time) [2]int64 {
	if u.cfg.Window <= 0 {
		return [2]int64{int64(stage), 0}
	}
	return [2]int64{int64(stage), due.UnixNano() / int64(u.cfg.Window)}
}

// windowKeys are the minute rule's windows of a stage that fell due at
// some time from due to latest.
func (u *user) windowKeys(stage int, due, latest time.Time) [][2]int64 {
	first, last := u.windowKey(stage, due), u.windowKey(stage, later(due, latest))
	var out [][2]int64
	for k := first; k[1] <= last[1]; k[1]++ {
		out = append(out, k)
	}
	return out
}

// clearBound is the bound of a stage due at due (at the latest at
// latest) had no unanswered signal landed, without the minute rule.
func (u *user) clearBound(stage int, due, latest time.Time) time.Time {
	b, _ := u.bound(stage, due, latest, nil)
	return b
}

// stray classifies a delivery that matches no silence (the first of its
// group): false, unless an unanswered signal may have set the deadline it
// names. One without an answer may have landed late, held in the service
// while its store was out of reach (a Redis pause, a failover): its
// deadline counts from then, up to the grace later than it would have.
func (u *user) stray(d Delivery) Verdict {
	v := Verdict{UID: u.uid, Deadline: d.Deadline, Stage: d.Stage, Due: d.Deadline, Bound: d.Deadline, Delivered: true,
		Class: False, Lateness: d.At.Sub(d.Deadline), Why: "delivered for no silence: the user's answered signals had moved its deadline"}
	for _, s := range u.signals {
		if s.Outcome == Answered || s.Deadline.IsZero() {
			continue
		}
		if d.Deadline.Sub(s.Deadline).Abs() <= u.cfg.Match || u.landedLate(s.Deadline, d.Deadline) {
			v.Class, v.Why = Indeterminate, "names a deadline a signal without an answer may have set, landing late"
		}
	}
	if d.Stage > len(u.cfg.Delays)+1 || d.Stage < 1 {
		v.Class, v.Why = False, "a stage the service does not have"
	}
	// The faults it met: those whose window (and grace) overlaps the
	// stretch from the deadline it names to its arrival.
	for _, f := range u.h.Faults {
		grace := cmp.Or(f.Grace, u.cfg.Grace)
		if !f.Start.After(d.At) && !d.Deadline.After(f.End.Add(grace)) && !slices.Contains(v.Faults, f.Kind) {
			v.Faults = append(v.Faults, f.Kind)
		}
	}
	slices.Sort(v.Faults)
	return v
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
