package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stillthere/stillthere/pkg/session"
)

// Report is what outagebench prints.
type Report struct {
	Command     string        `json:"command"`
	Gateways    int           `json:"gateways"`
	Active      int           `json:"active"`           // users pinging throughout
	Silent      int           `json:"silent_per_fault"` // users falling silent around each fault
	TTLMS       float64       `json:"ttl_ms"`
	JitterMS    float64       `json:"jitter_ms"`
	PingEveryMS float64       `json:"ping_every_ms"`
	GraceMS     float64       `json:"grace_ms"`
	OutageMS    float64       `json:"outage_ms"`
	Faults      []FaultResult `json:"faults"`
	Posts       int           `json:"webhook_posts"`    // guide posts the webhook took
	Distinct    int           `json:"webhook_distinct"` // distinct guide ids among them
}

// FaultResult is one fault's figures. Guides are attributed to the fault
// in whose phase (from its start to the next one's) they arrived; a
// silent user's guide to the fault its silence was placed around.
type FaultResult struct {
	Fault  string  `json:"fault"`
	What   string  `json:"what"`
	DownMS float64 `json:"down_ms"` // from the fault's start to its recovery
	// Active users, pinging throughout, and those of them guided in this
	// fault's phase: the goal is none.
	Active            int     `json:"active"`
	ActiveGuided      int     `json:"active_guided"`
	ActiveGuidedShare float64 `json:"active_guided_share"`
	// Silent users of this fault: guided exactly once at or after their
	// own deadline, not guided (lost), guided more than once (doubled).
	// Early counts users, of any fault, guided in this phase before the
	// deadline their last answered ping earned: guided while there.
	Silent     int `json:"silent"`
	GuidedOnce int `json:"guided_once"`
	Lost       int `json:"lost"`
	Doubled    int `json:"doubled"`
	Early      int `json:"guided_early"`
	// Affected are the silent users the fault delayed: their deadline
	// fell before the grace after the recovery ran out, and their guide
	// came after the recovery. (The listener holds deadlines from where it
	// saw the outage begin: its last sweep, a gateway's last heartbeat,
	// which may be a little before the fault.) Their extra delay is their
	// guide's arrival minus the later of their deadline and the recovery.
	// The others' guides are timed from their deadline.
	Affected    int     `json:"affected"`
	ExtraP50MS  float64 `json:"extra_delay_p50_ms"`
	ExtraP99MS  float64 `json:"extra_delay_p99_ms"`
	ExtraMaxMS  float64 `json:"extra_delay_max_ms"`
	OthersP99MS float64 `json:"others_latency_p99_ms"`
	// What the mechanism did: timeouts the listener held, by rule; the
	// blind intervals recorded, relative to the fault's start; the
	// services' log lines in the phase.
	Held  map[string]int `json:"held"`
	Blind []string       `json:"blind_intervals"`
	Logs  []string       `json:"logs"`
	Dials int            `json:"dials"` // the users' connects tried in the phase, failed ones included
	// Evidence names the first users guided wrongly, lost or doubled.
	Evidence []string `json:"evidence,omitempty"`
}

// maxEvidence bounds the evidence lines per fault.
const maxEvidence = 10

// phase is one fault as it ran.
type phase struct {
	f                fault
	start, recovered time.Time
	end              time.Time // the next phase's start, or the end of the run
	set              []*user   // its silent users
	held             map[string]int
	dials            int // the users' dials up to start
	res              FaultResult
}

func (p *phase) note(format string, a ...any) {
	if len(p.res.Evidence) < maxEvidence {
		p.res.Evidence = append(p.res.Evidence, fmt.Sprintf(format, a...))
	}
}

// rel is t relative to the phase's start, in seconds.
func (p *phase) rel(t time.Time) string { return fmt.Sprintf("%+.1fs", t.Sub(p.start).Seconds()) }

// phaseAt is the phase t fell in: the last one started by t, or the first.
func phaseAt(phases []*phase, t time.Time) *phase {
	at := phases[0]
	for _, p := range phases {
		if !t.Before(p.start) {
			at = p
		}
	}
	return at
}

// judge fills every phase's result from the users' deadlines and the
// guides the webhook took.
func judge(phases []*phase, users []*user, hook *webhook, grace time.Duration, active int) {
	extra := make([][]float64, len(phases))
	others := make([][]float64, len(phases))
	guidedIn := make([]map[string]bool, len(phases))
	for i, p := range phases {
		p.res.Active, p.res.Silent = active, len(p.set)
		guidedIn[i] = map[string]bool{}
	}
	index := func(p *phase) int { return slices.Index(phases, p) }
	for _, u := range users {
		gs := hook.guides(u.uid)
		low, _ := u.Deadlines()
		if u.set < 0 {
			for _, g := range gs {
				p := phaseAt(phases, g.at)
				if !guidedIn[index(p)][u.uid] {
					guidedIn[index(p)][u.uid] = true
					p.res.ActiveGuided++
					p.note("active %s guided at %s for the deadline %s", u.uid, p.rel(g.at), p.rel(g.deadline))
				}
			}
			continue
		}
		own := phases[u.set]
		var timely []shown
		for _, g := range gs {
			if g.at.Before(low) {
				p := phaseAt(phases, g.at)
				p.res.Early++
				p.note("silent %s guided at %s for the deadline %s, before the deadline %s its last answered ping earned", u.uid, p.rel(g.at), p.rel(g.deadline), p.rel(low))
				continue
			}
			timely = append(timely, g)
		}
		if len(gs) > 1 {
			own.res.Doubled++
			own.note("silent %s shown %d guides, the first at %s", u.uid, len(gs), own.rel(gs[0].at))
		}
		if len(timely) == 0 {
			own.res.Lost++
			own.note("silent %s not guided after its deadline %s", u.uid, own.rel(low))
			continue
		}
		if len(gs) == 1 {
			own.res.GuidedOnce++
		}
		g := timely[0]
		due := later(low, g.deadline)
		if !due.After(own.recovered.Add(grace)) && !g.at.Before(own.recovered) {
			own.res.Affected++
			extra[u.set] = append(extra[u.set], ms(g.at.Sub(later(due, own.recovered))))
		} else {
			others[u.set] = append(others[u.set], ms(g.at.Sub(due)))
		}
	}
	for i, p := range phases {
		p.res.ExtraP50MS, p.res.ExtraP99MS, p.res.ExtraMaxMS = quantiles(extra[i])
		_, p.res.OthersP99MS, _ = quantiles(others[i])
		if active > 0 {
			p.res.ActiveGuidedShare = float64(p.res.ActiveGuided) / float64(active)
		}
	}
}

// blindFor lists the blind intervals that ended in p's phase, relative to
// its start.
func (p *phase) blindFor(all []session.BlindInterval) []string {
	var out []string
	for _, b := range all {
		if b.End.Before(p.start) || !b.End.Before(p.end) {
			continue
		}
		s := fmt.Sprintf("%s %s to %s", b.Reason, p.rel(b.Start), p.rel(b.End))
		if b.Scope != "" {
			s += " (" + b.Scope + ")"
		}
		out = append(out, s)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Milliseconds()) }

func quantiles(v []float64) (p50, p99, maxv float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	slices.Sort(v)
	return v[len(v)/2], v[min(len(v)-1, len(v)*99/100)], v[len(v)-1]
}

// heldMetric counts the timeouts the listener held for the grace, by
// rule; the listener runs in this process, so it is in the default
// registry.
const heldMetric = "stillthere_listener_held_total"

func held() map[string]int {
	out := map[string]int{}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != heldMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" {
					out[l.GetValue()] += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}

// since is now minus then, per rule, leaving out zeros.
func since(now, then map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range now {
		if d := v - then[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
