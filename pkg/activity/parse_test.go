package activity

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// now is the clock the tests judge at_ms by.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// batch wraps events into a batch body.
func batch(events ...string) []byte {
	return []byte(`{"events":[` + strings.Join(events, ",") + `]}`)
}

func TestParseBatchAccepts(t *testing.T) {
	at := now.UnixMilli()
	for _, tt := range []struct {
		name string
		body []byte
		want []Event
	}{
		{"active", batch(`{"uid":"u1","kind":"active"}`), []Event{{UID: "u1", Kind: Active}}},
		{"every field", batch(fmt.Sprintf(`{"uid":"u:1@x.y-z_","kind":"turn","to":"us","seg":"vip.1","at_ms":%d,"max_ms":86400000,"id":"evt 7/é"}`, at)),
			[]Event{{UID: "u:1@x.y-z_", Kind: Turn, To: ToUs, Seg: "vip.1", AtMS: at, MaxMS: 86400000, ID: "evt 7/é"}}},
		{"turn to user", batch(`{"kind":"turn","uid":"u","to":"user"}`), []Event{{UID: "u", Kind: Turn, To: ToUser}}},
		{"end, whitespace", []byte(" {\n \"events\" : [ { \"uid\" : \"u\" , \"kind\" : \"end\" } ] }\n"), []Event{{UID: "u", Kind: End}}},
		{"at_ms a day ahead", batch(fmt.Sprintf(`{"uid":"u","kind":"active","at_ms":%d}`, now.Add(MaxAhead).UnixMilli())),
			[]Event{{UID: "u", Kind: Active, AtMS: now.Add(MaxAhead).UnixMilli()}}},
		{"at_ms 2020", batch(`{"uid":"u","kind":"active","at_ms":1577836800000}`), []Event{{UID: "u", Kind: Active, AtMS: 1577836800000}}},
		{"max_ms 1", batch(`{"uid":"u","kind":"turn","to":"us","max_ms":1}`), []Event{{UID: "u", Kind: Turn, To: ToUs, MaxMS: 1}}},
		{"order kept", batch(`{"uid":"a","kind":"turn","to":"us"}`, `{"uid":"a","kind":"turn","to":"user"}`, `{"uid":"b","kind":"active"}`),
			[]Event{{UID: "a", Kind: Turn, To: ToUs}, {UID: "a", Kind: Turn, To: ToUser}, {UID: "b", Kind: Active}}},
		{"max events", batch(slicesRepeat(`{"uid":"u","kind":"active"}`, MaxEvents)...), eventsRepeat(Event{UID: "u", Kind: Active}, MaxEvents)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBatch(tt.body, now)
			if err != nil {
				t.Fatalf("ParseBatch: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func slicesRepeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func eventsRepeat(e Event, n int) []Event {
	out := make([]Event, n)
	for i := range out {
		out[i] = e
	}
	return out
}

func TestParseBatchRefuses(t *testing.T) {
	ok := `{"uid":"u","kind":"active"}`
	at := func(ms int64) string { return fmt.Sprintf(`{"uid":"u","kind":"active","at_ms":%d}`, ms) }
	for _, tt := range []struct {
		name  string
		body  []byte
		index int
		field string
		want  string // in the error's text
	}{
		{"not JSON", []byte(`events`), -1, "", "invalid JSON"},
		{"empty body", nil, -1, "", "invalid JSON"},
		{"array", []byte(`[]`), -1, "", "want a JSON object"},
		{"no events", []byte(`{}`), -1, "events", "want 1-1000 events"},
		{"empty events", batch(), -1, "events", "want 1-1000 events"},
		{"events null", []byte(`{"events":null}`), -1, "events", "want an array"},
		{"events object", []byte(`{"events":{}}`), -1, "events", "want an array"},
		{"unknown top field", []byte(`{"events":[` + ok + `],"more":1}`), -1, "more", "unknown field"},
		{"events twice", []byte(`{"events":[` + ok + `],"events":[` + ok + `]}`), -1, "events", "given twice"},
		{"trailing data", []byte(`{"events":[` + ok + `]}{}`), -1, "", "data after the JSON value"},
		{"trailing comma", batch(ok, ``), 1, "", "invalid JSON"},
		{"truncated", []byte(`{"events":[` + ok), -1, "", "invalid JSON"},
		{"invalid UTF-8", []byte("{\"events\":[{\"uid\":\"u\",\"kind\":\"active\",\"id\":\"\xff\"}]}"), -1, "", "invalid UTF-8"},
		{"event not object", batch(ok, `"u"`), 1, "", "want a JSON object"},
		{"unknown field", batch(ok, ok, ok, `{"uid":"u","kind":"active","typing":true}`), 3, "typing", "unknown field"},
		{"duplicate key", batch(`{"uid":"u","kind":"active","uid":"v"}`), 0, "uid", "given twice"},
		{"no uid", batch(`{"kind":"active"}`), 0, "uid", "required"},
		{"bad uid", batch(`{"uid":"a b","kind":"active"}`), 0, "uid", "want 1-128 characters"},
		{"long uid", batch(`{"uid":"` + strings.Repeat("u", 129) + `","kind":"active"}`), 0, "uid", "want 1-128 characters"},
		{"uid number", batch(`{"uid":7,"kind":"active"}`), 0, "uid", "want a string"},
		{"uid null", batch(`{"uid":null,"kind":"active"}`), 0, "uid", "want a string"},
		{"no kind", batch(`{"uid":"u"}`), 0, "kind", "required"},
		{"bad kind", batch(ok, `{"uid":"u","kind":"typing"}`), 1, "kind", `want "active", "turn" or "end"`},
		{"kind array", batch(`{"uid":"u","kind":["active"]}`), 0, "kind", "want a string"},
		{"turn without to", batch(`{"uid":"u","kind":"turn"}`), 0, "to", `required with kind "turn"`},
		{"bad to", batch(ok, ok, ok, `{"uid":"u","kind":"turn","to":"them"}`, ok), 3, "to", `want "user" or "us"`},
		{"to with active", batch(`{"uid":"u","kind":"active","to":"us"}`), 0, "to", `only with kind "turn"`},
		{"to with end", batch(`{"uid":"u","kind":"end","to":"user"}`), 0, "to", `only with kind "turn"`},
		{"bad seg", batch(`{"uid":"u","kind":"active","seg":"a:b"}`), 0, "seg", "want 1-64 characters"},
		{"empty seg", batch(`{"uid":"u","kind":"active","seg":""}`), 0, "seg", "want 1-64 characters"},
		{"at_ms zero", batch(at(0)), 0, "at_ms", "from 2020 on"},
		{"at_ms negative", batch(at(-1)), 0, "at_ms", "from 2020 on"},
		{"at_ms seconds", batch(at(now.Unix())), 0, "at_ms", "from 2020 on"},
		{"at_ms before 2020", batch(at(1577836799999)), 0, "at_ms", "from 2020 on"},
		{"at_ms more than a day ahead", batch(at(now.Add(MaxAhead).UnixMilli() + 1)), 0, "at_ms", "ahead of this server's clock"},
		{"at_ms fraction", batch(`{"uid":"u","kind":"active","at_ms":1700000000000.5}`), 0, "at_ms", "want an integer of milliseconds"},
		{"at_ms exponent", batch(`{"uid":"u","kind":"active","at_ms":17e11}`), 0, "at_ms", "want an integer of milliseconds"},
		{"at_ms overflow", batch(`{"uid":"u","kind":"active","at_ms":99999999999999999999}`), 0, "at_ms", "want an integer of milliseconds"},
		{"at_ms string", batch(`{"uid":"u","kind":"active","at_ms":"1700000000000"}`), 0, "at_ms", "want an integer"},
		{"max_ms with active", batch(`{"uid":"u","kind":"active","max_ms":1000}`), 0, "max_ms", `only with kind "turn" to "us"`},
		{"max_ms with turn to user", batch(`{"uid":"u","kind":"turn","to":"user","max_ms":1000}`), 0, "max_ms", `only with kind "turn" to "us"`},
		{"max_ms zero", batch(`{"uid":"u","kind":"turn","to":"us","max_ms":0}`), 0, "max_ms", "want 1-86400000"},
		{"max_ms past a day", batch(`{"uid":"u","kind":"turn","to":"us","max_ms":86400001}`), 0, "max_ms", "want 1-86400000"},
		{"empty id", batch(`{"uid":"u","kind":"active","id":""}`), 0, "id", "want 1-128 bytes"},
		{"long id", batch(`{"uid":"u","kind":"active","id":"` + strings.Repeat("i", 129) + `"}`), 0, "id", "want 1-128 bytes"},
		{"id control", batch(`{"uid":"u","kind":"active","id":"a\nb"}`), 0, "id", "want printable characters"},
		{"id bool", batch(`{"uid":"u","kind":"active","id":true}`), 0, "id", "want a string"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBatch(tt.body, now)
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("got %+v, %v; want a *FieldError", got, err)
			}
			if got != nil {
				t.Errorf("events %+v returned with the error", got)
			}
			if fe.Index != tt.index || fe.Field != tt.field || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q (index %d, field %q); want index %d, field %q, about %q", err, fe.Index, fe.Field, tt.index, tt.field, tt.want)
			}
		})
	}
}

// TestFieldErrorText: the error's text names the event and the field as
// a path into the batch.
func TestFieldErrorText(t *testing.T) {
	_, err := ParseBatch(batch(`{"uid":"u","kind":"active"}`, `{"uid":"u","kind":"active"}`, `{"uid":"u","kind":"active"}`, `{"uid":"u","kind":"turn","to":"x"}`), now)
	if err == nil || err.Error() != `events[3].to: want "user" or "us"` {
		t.Fatalf("got %v", err)
	}
	for _, tt := range []struct {
		e    FieldError
		want string
	}{
		{FieldError{Index: 2, Reason: "invalid JSON"}, "events[2]: invalid JSON"},
		{FieldError{Index: -1, Field: "events", Reason: "want 1-1000 events"}, "events: want 1-1000 events"},
		{FieldError{Index: -1, Reason: "invalid UTF-8"}, "invalid UTF-8"},
	} {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.e, got, tt.want)
		}
	}
}

// TestParseBatchTooMany: the 1001st event refuses the batch with
// ErrTooManyEvents, before it is read.
func TestParseBatchTooMany(t *testing.T) {
	events := slicesRepeat(`{"uid":"u","kind":"active"}`, MaxEvents)
	_, err := ParseBatch(batch(append(events, `"not even an event"`)...), now)
	if !errors.Is(err, ErrTooManyEvents) {
		t.Fatalf("got %v, want ErrTooManyEvents", err)
	}
}

// TestMaxBodyBytes: MaxEvents of the longest events, in compact JSON
// with every id character escaped as \"", fit in MaxBodyBytes.
func TestMaxBodyBytes(t *testing.T) {
	e := Event{UID: strings.Repeat("u", 128), Kind: Turn, To: ToUs, Seg: strings.Repeat("s", 64),
		AtMS: now.UnixMilli(), MaxMS: MaxHold.Milliseconds(), ID: strings.Repeat(`"`, 64)}
	b, err := json.Marshal(map[string]any{"events": eventsRepeat(e, MaxEvents)})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxBodyBytes {
		t.Fatalf("%d bytes, past MaxBodyBytes %d", len(b), MaxBodyBytes)
	}
	if _, err := ParseBatch(b, now); err != nil {
		t.Fatal(err)
	}
	one, _ := json.Marshal(e)
	if len(one) > MaxRecordBytes {
		t.Fatalf("one event of %d bytes, past MaxRecordBytes %d", len(one), MaxRecordBytes)
	}
}

func TestParseEvent(t *testing.T) {
	got, err := ParseEvent([]byte(`{"uid":"u","kind":"turn","to":"us","max_ms":5000,"id":"e1"}`), now)
	if want := (Event{UID: "u", Kind: Turn, To: ToUs, MaxMS: 5000, ID: "e1"}); err != nil || got != want {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	if got.MaxHoldFor() != 5*time.Second || !got.At().IsZero() {
		t.Fatalf("MaxHoldFor %v, At %v", got.MaxHoldFor(), got.At())
	}
	for _, tt := range []struct {
		name, record, field, want string
	}{
		{"batch", `{"events":[]}`, "events", "unknown field"},
		{"trailing", `{"uid":"u","kind":"end"} {"uid":"u","kind":"end"}`, "", "data after the JSON value"},
		{"to with end", `{"uid":"u","kind":"end","to":"us"}`, "to", `only with kind "turn"`},
		{"no uid", `{"kind":"end"}`, "uid", "required"},
		{"too long", `{"uid":"u","kind":"end","id":"` + strings.Repeat(" ", MaxRecordBytes) + `"}`, "", "want at most"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseEvent([]byte(tt.record), now)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Index != -1 || fe.Field != tt.field || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v (%+v); want field %q, about %q", err, fe, tt.field, tt.want)
			}
			if err.Error() != tt.field+": "+fe.Reason && tt.field != "" {
				t.Fatalf("text %q does not name the field alone", err)
			}
		})
	}
	at := time.UnixMilli(now.UnixMilli() - 1500)
	e, err := ParseEvent(fmt.Appendf(nil, `{"uid":"u","kind":"active","at_ms":%d}`, at.UnixMilli()), now)
	if err != nil || !e.At().Equal(at) {
		t.Fatalf("At %v, %v; want %v", e.At(), err, at)
	}
}

func TestCheckSecret(t *testing.T) {
	push := strings.Repeat("p", 32)
	for _, tt := range []struct {
		secret, want string
	}{
		{"", ""},
		{strings.Repeat("a", 32), ""},
		{strings.Repeat("a", 31), "activity-secret: 31 bytes, want at least 32"},
		{push, "activity-secret: the same as push-secret"},
	} {
		err := CheckSecret(tt.secret, push)
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("CheckSecret(%d bytes): %v, want %q", len(tt.secret), err, tt.want)
		}
	}
}
