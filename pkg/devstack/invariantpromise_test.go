package devstack

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/promise"
)

// The random schedule's history, checked by the promise checker too: the
// same users, guides and disruptions the schedule's own checker reads,
// in the checker's terms.

// history is the run's history for the promise checker.
func (r *invRun) history() (promise.History, time.Duration) {
	h := promise.History{End: time.Now()}
	var rtt time.Duration // the slowest pong: a deadline is known to within it
	for _, u := range r.users {
		for _, p := range u.pings {
			s := promise.Signal{UID: u.uid, Kind: promise.Ping, Sent: p.sent}
			_, high := p.deadline()
			s.Deadline = high
			if p.confirmed() {
				s.Outcome, s.Answered = promise.Answered, p.answered
				rtt = max(rtt, p.answered.Sub(p.sent))
			} else {
				s.Outcome = promise.NoAnswer
			}
			h.Signals = append(h.Signals, s)
		}
		for _, c := range u.closes {
			s := promise.Signal{UID: u.uid, Kind: promise.End, Sent: c.sent, Outcome: promise.Answered, Answered: c.answered.Add(invEndLag)}
			switch c.effect {
			case closeContinues:
				continue
			case closeUnclear:
				s.Outcome, s.Answered = promise.NoAnswer, time.Time{}
			}
			h.Signals = append(h.Signals, s)
		}
		for _, g := range r.p.hook.Guides(u.uid) {
			h.Deliveries = append(h.Deliveries, promise.Delivery{UID: u.uid, ID: g.ID, Stage: max(g.Stage, 1), Deadline: g.Deadline,
				At: g.At, Sink: "webhook", Idempotent: true})
		}
	}
	for _, d := range r.disruptions {
		end := d.end
		if end.IsZero() {
			end = h.End
		}
		h.Faults = append(h.Faults, promise.Fault{Kind: d.kind, Start: d.start, End: end, Grace: d.extra})
	}
	return h, rtt
}

// checkPromise runs the promise checker over the run and fails the test
// on any lost, false, duplicated, disordered or spam stage. Lateness is
// the schedule's own checker's to judge: its bounds follow each
// disruption's own recovery, which the fault windows here only
// approximate (beside two CPU hogs the checker called 6 of 215 stages
// late that those bounds allowed).
func (r *invRun) checkPromise() {
	h, rtt := r.history()
	slack := rtt + invEps + 50*time.Millisecond
	cfg := promise.Config{Slack: guideSlack, InFlight: slack, Match: slack, Stale: invStaleSlack + rtt, Window: time.Minute}
	vs := promise.Check(cfg, h)
	r.t.Logf("the promise, by fault kind (in-flight slack %v):\n%s", slack, promise.Markdown(promise.Table(vs)))
	var failed, uids []string
	for _, v := range vs {
		if v.Class.Failure() {
			failed = append(failed, fmt.Sprintf("%s stage %d, deadline %s: %s: %s (due %s, bound %s)",
				v.UID, v.Stage, r.rel(v.Deadline), v.Class, v.Why, r.rel(v.Due), r.rel(v.Bound)))
			if !slices.Contains(uids, v.UID) {
				uids = append(uids, v.UID)
			}
		}
	}
	if len(failed) > 0 {
		r.t.Errorf("seed %d: the promise checker found %d stages that broke the promise; the first:\n  %s", r.seed, len(failed), joinFirst(failed, 25))
		r.logHistories(uids[:min(5, len(uids))])
	}
}

// logHistories logs what each of uids did, the timeouts the listener
// produced for them and the guides that reached the webhook.
func (r *invRun) logHistories(uids []string) {
	events := r.p.events()
	for _, u := range r.users {
		if !slices.Contains(uids, u.uid) {
			continue
		}
		lines := slices.Clone(u.notes)
		for _, ev := range events[u.uid] {
			lines = append(lines, fmt.Sprintf("produced: stage %d, deadline %s, detected %s, id %s",
				ev.Stage, r.rel(ev.Deadline()), r.rel(time.UnixMilli(ev.DetectedMS)), ev.ID))
		}
		for _, g := range r.p.hook.Guides(u.uid) {
			lines = append(lines, fmt.Sprintf("guide: stage %d, deadline %s, at %s, id %s", g.Stage, r.rel(g.Deadline), r.rel(g.At), g.ID))
		}
		r.t.Logf("%s's history:\n  %s", u.uid, strings.Join(lines, "\n  "))
	}
}

func joinFirst(lines []string, n int) string {
	out := ""
	for i, l := range lines[:min(n, len(lines))] {
		if i > 0 {
			out += "\n  "
		}
		out += l
	}
	return out
}
