package timeline

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Describe says what e means, in a line for a person, times in loc:
// "held: blind (blind interval 12:02:40.000-12:02:58.000), recheck at
// 12:04:13.000".
func Describe(e Entry, loc *time.Location) string {
	clock := func(ms int64) string { return time.UnixMilli(ms).In(loc).Format("15:04:05.000") }
	var b strings.Builder
	b.WriteString(string(e.Kind))
	if e.Rule != "" {
		b.WriteString(": " + e.Rule)
	}
	var parts []string
	if e.Stage > 0 {
		parts = append(parts, fmt.Sprintf("stage %d", e.Stage))
	}
	if e.Segment != "" {
		parts = append(parts, "segment "+e.Segment)
	}
	if e.Device != "" {
		parts = append(parts, "device "+e.Device)
	}
	if e.Deadline > 0 {
		parts = append(parts, "deadline "+clock(e.Deadline))
	}
	if e.BlindMS[0] > 0 || e.BlindMS[1] > 0 {
		parts = append(parts, "blind interval "+clock(e.BlindMS[0])+"-"+clock(e.BlindMS[1]))
	}
	if e.Conns > 0 {
		parts = append(parts, fmt.Sprintf("%d connection%s", e.Conns, map[bool]string{true: "s"}[e.Conns != 1]))
	}
	if e.Code != 0 {
		parts = append(parts, fmt.Sprintf("code %d", e.Code))
	}
	if e.Event != "" {
		parts = append(parts, "event "+e.Event)
	}
	if e.Detail != "" {
		parts = append(parts, e.Detail)
	}
	if len(parts) > 0 {
		b.WriteString(" (" + strings.Join(parts, ", ") + ")")
	}
	if e.Until > 0 {
		b.WriteString(", recheck at " + clock(e.Until))
	}
	return b.String()
}

// Format writes entries as a table, oldest first: time, who recorded it,
// what it means.
func Format(w io.Writer, entries []Entry, loc *time.Location) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tBY\tDECISION")
	for _, e := range entries {
		by := e.Service
		if e.Instance != "" {
			by += "/" + e.Instance
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", e.At.In(loc).Format("2006-01-02 15:04:05.000"), by, Describe(e, loc))
	}
	return tw.Flush()
}

// Kinds is entries' kinds and rules in order, "lapse: held:blind
// produced:": a timeline at a glance, for logs and tests.
func Kinds(entries []Entry) string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = string(e.Kind) + ":" + e.Rule
	}
	return strings.Join(out, " ")
}
