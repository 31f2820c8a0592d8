package promise

import (
	"strings"
	"testing"
	"time"
)

func TestTable(t *testing.T) {
	vs := []Verdict{
		{Class: OK, Delivered: true, Lateness: 100 * time.Millisecond},
		{Class: OK, Delivered: true, Lateness: 300 * time.Millisecond},
		{Class: OK}, // came back: no lateness
		{Class: Late, Delivered: true, Lateness: 9 * time.Second, Faults: []string{"redis-pause"}},
		{Class: Spam, Delivered: true, Faults: []string{"cut", "redis-pause"}},
		{Class: Indeterminate, Faults: []string{"cut"}},
	}
	rows := Table(vs)
	var names []string
	for _, r := range rows {
		names = append(names, r.Fault)
	}
	if got := strings.Join(names, ","); got != "all,none,cut,redis-pause" {
		t.Fatalf("rows %s", got)
	}
	all, none, cut, pause := rows[0], rows[1], rows[2], rows[3]
	if all.Stages != 6 || all.Counts[OK] != 3 || all.Failures() != 1 {
		t.Errorf("all: %+v, %d failures", all, all.Failures())
	}
	if none.Stages != 3 || none.LateP50 != 100*time.Millisecond || none.LateMax != 300*time.Millisecond {
		t.Errorf("none: %+v", none)
	}
	if cut.Stages != 2 || cut.Counts[Spam] != 1 || cut.Counts[Indeterminate] != 1 || cut.Failures() != 1 {
		t.Errorf("cut: %+v", cut)
	}
	if pause.Stages != 2 || pause.LateMax != 9*time.Second || pause.Failures() != 1 {
		t.Errorf("redis-pause: %+v", pause)
	}
	md := Markdown(rows)
	for _, want := range []string{"| fault | stages | ok | late | lost | false | duplicated | disordered | indeterminate | spam | pending |", "| cut | 2 | 0 | 0 | 0 | 0 | 0 | 0 | 1 | **1** | 0 |", "9000 ms |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// FuzzCheck: any history is classified without a panic, and every
// delivery is in a verdict that says it was delivered.
func FuzzCheck(f *testing.F) {
	f.Add([]byte{0, 10, 1, 0, 50, 2, 1, 100, 1})
	f.Add([]byte{1, 0, 0, 2, 30, 1, 3, 5, 2, 0, 200, 1, 0, 201, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h History
		h.End = at(120)
		for i := 0; i+2 < len(b); i += 3 {
			sec := float64(b[i+1]) / 2
			switch b[i] % 4 {
			case 0, 1: // a signal
				s := ping(sec, Outcome(1+b[i+2]%3))
				s.Kind = Kind(1 + b[i]/4%4)
				if s.Kind == End || s.Kind == TurnToUs && b[i+2]%2 == 0 {
					s.Deadline = time.Time{}
				}
				h.Signals = append(h.Signals, s)
			case 2: // a delivery naming a deadline on a 10 s grid
				h.Deliveries = append(h.Deliveries, guide("x", int(b[i+2]%4), float64(b[i+1]/20*10), sec))
			case 3:
				h.Faults = append(h.Faults, Fault{Kind: "f", Start: at(sec), End: at(sec + float64(b[i+2]%30))})
			}
		}
		vs := Check(cfg, h)
		delivered := 0
		for _, v := range vs {
			if v.Delivered {
				delivered++
			}
			if v.Class == "" {
				t.Fatalf("a verdict without a class: %+v", v)
			}
		}
		if len(h.Deliveries) > 0 && delivered == 0 {
			t.Fatalf("%d deliveries, none in a verdict", len(h.Deliveries))
		}
	})
}
