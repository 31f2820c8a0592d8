package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/promise"
)

// failures are the verdicts that broke the promise.
func (res *result) failures() []promise.Verdict {
	var out []promise.Verdict
	for _, v := range res.verdicts {
		if v.Class.Failure() {
			out = append(out, v)
		}
	}
	return out
}

// failed: a stage broke the promise, or (when asked) a path never ran.
func (res *result) failed(coverage bool) bool {
	return len(res.failures()) > 0 || (coverage && len(res.missed) > 0)
}

// maxListed bounds the failures the report lists one by one.
const maxListed = 40

func (res *result) markdown() string {
	var b strings.Builder
	s := res.s
	fmt.Fprintf(&b, "# Fault-schedule run (nemesis)\n\n")
	fmt.Fprintf(&b, "Seed **%d**, faults composed for %v (whole run %v), replay with `make nemesis SEED=%d DURATION=%v`.\n\n",
		s.seed, s.duration, res.took.Round(time.Second), s.seed, s.duration)
	fmt.Fprintf(&b, "Stack: %d gateways, %d expiry listeners, %d guide consumers (child processes), a Redis Cluster of %d masters with a replica each, kfake in process. "+
		"%d users: %d on WebSockets (%d with two devices), %d on the activity API (active, turns to the user and to us with max_ms), each with one device for guides. "+
		"Session TTL %v, no jitter, a reminder at the deadline and a close stage %v after it; the listeners' outage grace %v.\n\n",
		nGateways, nListeners, nConsumers, nMasters, s.users, s.users*3/5, s.users*3/5/3, s.users-s.users*3/5, s.ttl, s.closeAfter, s.grace)
	fmt.Fprintf(&b, "History: %d signals, %d guides seen on devices (%d of them an id the device had seen, which it shows once), %d fault windows. Checked with slack %v, in-flight %v, stale %v, grace %v (a consumer's faults: %v more), match %v, minute window %v; the checker's history ends %v before the recording did, so that a stage due just before is seen late rather than taken for lost.\n\n",
		res.signals, res.guides, res.repeats, len(res.outcomes), res.cfg.Slack, res.cfg.InFlight, res.cfg.Stale, res.cfg.Grace, groupSessionTimeout, res.cfg.Match, res.cfg.Window, lostMargin)
	fmt.Fprintf(&b, "A stage never delivered past its bound is lost unless its user's timeline shows the stack still had it (held, or in flight) when the user came back, and cancelled it then: late. %d stages were so.\n\n", res.excused)

	fails := res.failures()
	verdict := "**passed**"
	if len(fails) > 0 {
		verdict = fmt.Sprintf("**failed**: %d stages broke the promise", len(fails))
	}
	if len(res.missed) > 0 {
		verdict += fmt.Sprintf("; paths never reached: %s", strings.Join(res.missed, ", "))
	}
	fmt.Fprintf(&b, "Verdict: %s.\n\n", verdict)

	b.WriteString("## The promise, by fault kind\n\n")
	b.WriteString("Each stage of each silence, classified by package promise; a stage that met several kinds counts in each row, \"none\" is the stages that met no fault. Lateness is past each stage's due time.\n\n")
	b.WriteString(promise.Markdown(res.rows))
	b.WriteString("\n")

	b.WriteString("## Paths reached\n\n| path | count |\n|---|---|\n")
	names := make([]string, 0, len(paths)+1)
	for _, p := range paths {
		names = append(names, p.name)
	}
	names = append(names, rebalancePath)
	for _, n := range names {
		mark := ""
		if res.totals[n] <= 0 {
			mark = " **never ran**"
		}
		fmt.Fprintf(&b, "| %s | %.0f%s |\n", n, res.totals[n], mark)
	}
	b.WriteString("\nHolds, the brake and deferred minutes are `stillthere_listener_held_total` by rule; spool replays `stillthere_listener_replayed_total`; stale marks the consumer's `stale` outcomes; resyncs `stillthere_gateway_resynced_total`; rebalances the group joins kfake saw after the users were up. Summed over every start of every process, from scrapes every second: a process killed loses what it counted since its last scrape.\n\n")
	if res.crashes > 0 {
		fmt.Fprintf(&b, "Processes that exited without the schedule killing them: **%d**.\n\n", res.crashes)
	}

	b.WriteString("## Failures\n\n")
	if len(fails) == 0 {
		b.WriteString("None.\n\n")
	} else {
		slices.SortFunc(fails, func(a, c promise.Verdict) int { return a.Deadline.Compare(c.Deadline) })
		for i, v := range fails {
			if i == maxListed {
				fmt.Fprintf(&b, "- ... and %d more\n", len(fails)-maxListed)
				break
			}
			fmt.Fprintf(&b, "- %s stage %d, deadline %s: **%s**: %s (due %s, bound %s, faults met: %s)\n",
				v.UID, v.Stage, res.rel(v.Deadline), v.Class, v.Why, res.rel(v.Due), res.rel(v.Bound), strings.Join(v.Faults, ", "))
		}
		b.WriteString("\n")
	}
	if len(res.harness) > 0 {
		b.WriteString("Answers that say the bench itself is wrong:\n\n")
		for _, h := range res.harness {
			fmt.Fprintf(&b, "- %s\n", h)
		}
		b.WriteString("\n")
	}

	b.WriteString("## The schedule\n\nTimes from the schedule's start (as every time in this report); the window is as the run caused and healed it.\n\n| at | fault | target | held | window | error |\n|---|---|---|---|---|---|\n")
	for _, o := range res.outcomes {
		held := "(act)"
		if o.For > 0 {
			held = o.For.Round(100 * time.Millisecond).String()
		}
		errText := ""
		if o.Err != nil {
			errText = strings.ReplaceAll(o.Err.Error(), "\n", " ")
			if len(errText) > 160 {
				errText = errText[:160] + "..."
			}
		}
		fmt.Fprintf(&b, "| %.1fs | %s | %d | %s | %v | %s |\n", o.At.Seconds(), o.Kind, o.Target, held, o.End.Sub(o.Start).Round(100*time.Millisecond), errText)
	}
	b.WriteString("\n## Not covered\n\n")
	for _, n := range notImplemented {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

// rel is t from the schedule's start, for reading.
func (res *result) rel(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%+.1fs", t.Sub(res.start).Seconds())
}
