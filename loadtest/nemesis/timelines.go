package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/stillthere/stillthere/pkg/promise"
)

// tlEntry is one entry of a user's timeline as "gateway timeline -json"
// prints it: what the stack decided, when (Redis's clock, ms).
type tlEntry struct {
	AtMS     int64  `json:"at_ms"`
	Service  string `json:"service"`
	Kind     string `json:"kind"`
	Rule     string `json:"rule"`
	Detail   string `json:"detail"`
	Stage    int    `json:"stage"`
	Deadline int64  `json:"deadline_ms"`
	Until    int64  `json:"until_ms"`
}

func (e tlEntry) at() time.Time { return time.UnixMilli(e.AtMS) }

// readTimeline reads uid's timeline from the stack's Redis with
// "gateway timeline", the services' own settings.
func (r *rig) readTimeline(ctx context.Context, uid string, asJSON bool) ([]byte, error) {
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	args := []string{"timeline", "-utc", uid}
	if asJSON {
		args = []string{"timeline", "-json", uid}
	}
	cmd := exec.CommandContext(tctx, filepath.Join(r.s.bin, "gateway"), args...)
	cmd.Env = append(os.Environ(), r.common()...)
	cmd.Stderr = os.Stderr
	return cmd.Output()
}

// timelineOf is uid's timeline, parsed.
func (r *rig) timelineOf(ctx context.Context, uid string) ([]tlEntry, error) {
	out, err := r.readTimeline(ctx, uid, true)
	if err != nil {
		return nil, fmt.Errorf("gateway timeline %s: %w", uid, err)
	}
	var a struct {
		Entries []tlEntry `json:"entries"`
	}
	if err := json.Unmarshal(out, &a); err != nil {
		return nil, fmt.Errorf("gateway timeline %s: %w", uid, err)
	}
	return a.Entries, nil
}

// saveTimelines writes, beside the services' logs, the timeline of every
// user in uids as a table, before the rig and its Redis go. One that
// cannot be read says so in its file.
func (r *rig) saveTimelines(ctx context.Context, uids []string) {
	for _, uid := range uids {
		out, err := r.readTimeline(ctx, uid, false)
		if err != nil {
			out = append(out, fmt.Sprintf("\n(gateway timeline: %v)\n", err)...)
		}
		path := filepath.Join(r.dir, "logs", "timeline-"+uid+".txt")
		if err := os.WriteFile(path, out, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "nemesis:", err)
		}
	}
}

// The timeline's kinds and rules that show a stage still pending in the
// stack, and one cancelled because the user came back.
var (
	pendingKinds = map[string]bool{"lapse": true, "held": true, "deferred": true, "produced": true, "spooled": true, "replayed": true}
	// cameBackRules: a lapse a renewal or an end overtook (stale), a
	// guide the consumer or the gateway dropped because the user's
	// session was live again (skipped).
	cameBackRules = map[string]bool{"renewed": true, "ended": true, "came-back": true, "renewed-or-ended": true, "superseded": true}
)

// cancelledLate reclassifies a lost stage from its user's timeline: one
// the stack still held (or had in flight) past its bound, and cancelled
// only once the user had come back, was late, not lost; the product
// rightly sent nothing to a user who was there. The checker sees only
// the devices, where a stage late past the user's return and a stage the
// stack dropped look alike; the timeline tells them apart. It stays lost
// when the timeline shows no cancellation, one before the user came back
// (the history's next answered signal after the stage fell due), a guide
// sent for it, or nothing of the stage at all.
func cancelledLate(v promise.Verdict, h promise.History, es []tlEntry, cfg promise.Config) (promise.Verdict, bool) {
	if v.Class != promise.Lost {
		return v, false
	}
	var back time.Time // the user's return, as the history saw it
	for _, s := range h.Signals {
		if s.UID == v.UID && s.Outcome == promise.Answered && !s.Sent.Before(v.Due) && (back.IsZero() || s.Sent.Before(back)) {
			back = s.Sent
		}
	}
	if back.IsZero() {
		return v, false
	}
	near := func(ms int64) bool {
		d := time.UnixMilli(ms).Sub(v.Deadline)
		return d.Abs() <= cfg.Match
	}
	this := func(e tlEntry) bool { return e.Stage == v.Stage && near(e.Deadline) }
	var pending, held *tlEntry
	for i, e := range es {
		switch {
		case e.Kind == "sent" && this(e):
			return v, false // sent, and no device saw it
		case pendingKinds[e.Kind] && this(e):
			pending = &es[i]
			if e.Kind == "held" {
				held = &es[i]
			}
		case pending == nil:
		case e.at().Before(back.Add(-cfg.InFlight)):
			// Before the user came back: a cancellation then would be
			// the stack's mistake, not lateness.
			if cancels(e, v, held, this, near) {
				return v, false
			}
		case cancels(e, v, held, this, near):
			v.Class = promise.Late
			v.Lateness = e.at().Sub(v.Due)
			v.Why = fmt.Sprintf("not delivered by its bound: the stack still had it (%s %s) when the user came back, and cancelled it then (%s %s)",
				pending.Kind, pending.Rule, e.Kind, e.Rule)
			return v, true
		}
	}
	return v, false
}

// cancels reports whether e cancels the stage of v: a grant between its
// silence's stages that cancels it and the rest; a lapse of it found
// stale, or its guide skipped, because the user's session was live
// again; or, written by the renewal's own script without naming the
// stage, a renewal that overtook it while it was held.
func cancels(e tlEntry, v promise.Verdict, held *tlEntry, this func(tlEntry) bool, near func(int64) bool) bool {
	switch {
	case e.Kind == "granted" && e.Rule == "stages-cancelled":
		return near(e.Deadline) && e.Stage <= v.Stage
	case (e.Kind == "stale" || e.Kind == "skipped") && cameBackRules[e.Rule]:
		if e.Deadline == 0 && e.Stage == 0 {
			return held != nil && e.AtMS < held.Until
		}
		return this(e)
	}
	return false
}
