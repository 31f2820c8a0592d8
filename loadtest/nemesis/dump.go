package main

import (
	"encoding/json"
	"os"
	"slices"
	"time"
)

// dump writes the run's history and verdicts as JSON, one user's at a
// time, for reading a failure: times are milliseconds from the
// schedule's start.
func (res *result) dump(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	ms := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t.Sub(res.start).Milliseconds()
	}
	type line map[string]any
	var lines []line
	for _, s := range res.history.Signals {
		lines = append(lines, line{"uid": s.UID, "t": ms(s.Sent), "what": "signal", "kind": s.Kind, "outcome": s.Outcome.String(),
			"deadline": ms(s.Deadline), "answered": ms(s.Answered)})
	}
	for _, d := range res.history.Deliveries {
		lines = append(lines, line{"uid": d.UID, "t": ms(d.At), "what": "guide", "id": d.ID, "stage": d.Stage, "deadline": ms(d.Deadline), "sink": d.Sink})
	}
	for _, v := range res.verdicts {
		lines = append(lines, line{"uid": v.UID, "t": ms(v.Due), "what": "verdict", "stage": v.Stage, "class": v.Class, "why": v.Why,
			"deadline": ms(v.Deadline), "bound": ms(v.Bound), "faults": v.Faults})
	}
	for _, fl := range res.history.Faults {
		lines = append(lines, line{"uid": "", "t": ms(fl.Start), "what": "fault", "kind": fl.Kind, "end": ms(fl.End)})
	}
	slices.SortStableFunc(lines, func(a, b line) int {
		if c := compareAny(a["uid"], b["uid"]); c != 0 {
			return c
		}
		return compareAny(a["t"], b["t"])
	})
	enc := json.NewEncoder(f)
	for _, l := range lines {
		if err := enc.Encode(l); err != nil {
			return err
		}
	}
	return nil
}

func compareAny(a, b any) int {
	switch x := a.(type) {
	case string:
		y, _ := b.(string)
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
	case int64:
		y, _ := b.(int64)
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
	}
	return 0
}
