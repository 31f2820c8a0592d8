package promise

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// classes in the order a table shows them.
var classes = []Class{OK, Late, Lost, False, Duplicated, Disordered, Indeterminate, Spam, Pending}

// Row is one fault kind's line of the table, in Jepsen's form: how many
// stages met it and what became of them. The row "none" is the stages
// that met no fault; a stage that met several kinds counts in each.
type Row struct {
	Fault  string
	Stages int
	Counts map[Class]int
	// Lateness of the stages delivered (ok and late), past their due
	// time.
	LateP50, LateP99, LateMax time.Duration
}

// Failures counts the stages that broke the promise.
func (r Row) Failures() int {
	n := 0
	for c, k := range r.Counts {
		if c.Failure() {
			n += k
		}
	}
	return n
}

// Table sums verdicts by the fault kinds they met, "all" first and "none"
// next, then the kinds by name.
func Table(vs []Verdict) []Row {
	rows := map[string]*Row{}
	late := map[string][]time.Duration{}
	add := func(kind string, v Verdict) {
		r := rows[kind]
		if r == nil {
			r = &Row{Fault: kind, Counts: map[Class]int{}}
			rows[kind] = r
		}
		r.Stages++
		r.Counts[v.Class]++
		if v.Delivered && (v.Class == OK || v.Class == Late) {
			late[kind] = append(late[kind], v.Lateness)
		}
	}
	for _, v := range vs {
		add("all", v)
		if len(v.Faults) == 0 {
			add("none", v)
		}
		for _, k := range v.Faults {
			add(k, v)
		}
	}
	var out []Row
	for kind, r := range rows {
		ls := late[kind]
		slices.Sort(ls)
		if len(ls) > 0 {
			r.LateP50, r.LateP99, r.LateMax = quantile(ls, 0.5), quantile(ls, 0.99), ls[len(ls)-1]
		}
		out = append(out, *r)
	}
	rank := func(k string) int {
		switch k {
		case "all":
			return 0
		case "none":
			return 1
		}
		return 2
	}
	slices.SortFunc(out, func(a, b Row) int {
		if ra, rb := rank(a.Fault), rank(b.Fault); ra != rb {
			return ra - rb
		}
		return strings.Compare(a.Fault, b.Fault)
	})
	return out
}

// quantile of sorted: the nearest rank.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Markdown renders rows as a table.
func Markdown(rows []Row) string {
	var b strings.Builder
	b.WriteString("| fault | stages |")
	for _, c := range classes {
		fmt.Fprintf(&b, " %s |", c)
	}
	b.WriteString(" late p50 / p99 / max |\n|---|---|")
	b.WriteString(strings.Repeat("---|", len(classes)+1))
	b.WriteString("\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d |", r.Fault, r.Stages)
		for _, c := range classes {
			if n := r.Counts[c]; n > 0 && c.Failure() {
				fmt.Fprintf(&b, " **%d** |", n)
			} else {
				fmt.Fprintf(&b, " %d |", n)
			}
		}
		fmt.Fprintf(&b, " %s / %s / %s |\n", ms(r.LateP50), ms(r.LateP99), ms(r.LateMax))
	}
	return b.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }
