package activity

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// seeds are bodies and records the fuzzers start from.
var seeds = []string{
	`{"events":[{"uid":"u1","kind":"active"}]}`,
	`{"events":[{"uid":"u","kind":"turn","to":"us","seg":"vip","at_ms":1772366400000,"max_ms":60000,"id":"e-1"},{"uid":"u","kind":"turn","to":"user"},{"uid":"v","kind":"end"}]}`,
	`{"events":[{"uid":"u","kind":"active","uid":"v"}]}`,
	`{"events":[{"uid":"u","kind":"active"}]} []`,
	`{"uid":"u","kind":"turn","to":"us","max_ms":1}`,
	`{"uid":"u","kind":"end","at_ms":1.5e12}`,
	`{"events":[{"uid":"u","kind":"active","id":"\u00e9\ud83d\ude00"}]}`,
	`{"events":null}`,
	`[]`,
}

// checkAccepted: whatever was accepted is valid, re-encodes, and parses
// back equal.
func checkAccepted(t *testing.T, events []Event) {
	for i, e := range events {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatalf("event %d %+v does not encode: %v", i, e, err)
		}
		again, err := ParseEvent(b, now)
		if err != nil {
			t.Fatalf("event %d %+v re-encoded as %s: %v", i, e, b, err)
		}
		if again != e {
			t.Fatalf("event %d %+v re-parsed as %+v", i, e, again)
		}
	}
}

func FuzzParseBatch(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		events, err := ParseBatch(body, now)
		if err != nil {
			var fe *FieldError
			if events != nil || (!errors.As(err, &fe) && !errors.Is(err, ErrTooManyEvents)) {
				t.Fatalf("refused with %T %v and %d events", err, err, len(events))
			}
			if fe != nil && fe.Index >= MaxEvents {
				t.Fatalf("error at index %d", fe.Index)
			}
			return
		}
		if len(events) < 1 || len(events) > MaxEvents {
			t.Fatalf("accepted %d events", len(events))
		}
		checkAccepted(t, events)
		b, err := json.Marshal(map[string][]Event{"events": events})
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseBatch(b, now)
		if err != nil || !reflect.DeepEqual(again, events) {
			t.Fatalf("batch %s re-parsed as %+v, %v", b, again, err)
		}
	})
}

func FuzzParseEvent(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, record []byte) {
		e, err := ParseEvent(record, now)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Index != -1 || e != (Event{}) {
				t.Fatalf("refused with %T %v, and %+v", err, err, e)
			}
			return
		}
		checkAccepted(t, []Event{e})
	})
}
