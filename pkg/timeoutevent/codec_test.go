package timeoutevent

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sameAsEncodingJSON fails t unless Parse(in) is what Parse returned when
// every record went through encoding/json: the same event, the same error
// (text included), and when parsePlain reads in, the event encoding/json
// decodes from it, before any check.
func sameAsEncodingJSON(t *testing.T, in []byte) {
	t.Helper()
	e, err := Parse(in)
	we, werr := parseJSON(in)
	if e != we || (err == nil) != (werr == nil) || errors.Is(err, ErrUnknownVersion) != errors.Is(werr, ErrUnknownVersion) ||
		(err != nil && err.Error() != werr.Error()) {
		t.Fatalf("Parse(%q) = %+v, %v; through encoding/json: %+v, %v", in, e, err, we, werr)
	}
	pe, ok := parsePlain(in)
	if !ok {
		return
	}
	var w struct {
		Event
		V *int `json:"v"`
	}
	if err := json.Unmarshal(in, &w); err != nil || w.V == nil {
		t.Fatalf("parsePlain(%q) reads %+v; encoding/json: %v, v %v", in, pe, err, w.V)
	}
	w.Event.Version = *w.V
	if pe != w.Event {
		t.Fatalf("parsePlain(%q) = %+v; encoding/json: %+v", in, pe, w.Event)
	}
}

// codecSeeds are records of every kind Parse may take: plain, and each
// thing that makes a record not plain.
func codecSeeds() []string {
	d := time.UnixMilli(1_763_720_000_123)
	e := New("alice", "vip", d, d.Add(80*time.Millisecond), SourceSweep)
	var seeds []string
	for _, ev := range []Event{
		e,
		e.AtStage(2, d.Add(time.Minute), ActionRemind, "Still there?", true),
		e.AtStage(2, d.Add(time.Minute), ActionNotify, "", false),
		e.AtStage(3, d.Add(2*time.Minute), ActionClose, "We haven't heard from you, so we've closed this chat.", true),
		e.AtStage(2, d.Add(time.Minute), ActionRemind, `Tu es là ? "Réponds" \ <b>&</b>`+"\n\u2028", true),
	} {
		b, _ := json.Marshal(ev)
		seeds = append(seeds, string(b))
	}
	id := e.ID
	return append(seeds,
		// Every field, spaced out.
		" \t\r\n{ \"v\" : 1 , \"id\" : \""+id+"\" , \"uid\" : \"alice\" , \"segment\" : \"vip\" , \"deadline_ms\" : 1763720000123 , \"detected_ms\" : 1763720000203 , \"source\" : \"event\" , \"stage\" : 1 , \"due_ms\" : 1763720000123 , \"action\" : \"remind\" , \"final\" : false , \"reason\" : \"inactive\" , \"text\" : \"hi\" } \n",
		// From before stages, and before reasons.
		`{"v":1,"id":"`+id+`","uid":"alice","segment":"vip","deadline_ms":1763720000123,"detected_ms":1763720000200,"source":"sweep"}`,
		`{"v":1,"id":"`+StageID("alice", d.UnixMilli(), 2)+`","uid":"alice","deadline_ms":1763720000123,"stage":2,"due_ms":1763720180123,"action":"close","final":true,"text":"Closed."}`,
		// Escapes and non-ASCII.
		`{"v":1,"id":"`+id+`","uid":"\u0061lice","deadline_ms":1763720000123}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"text":"caf\u00e9 \"x\" \\ \/"}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"text":"café ✓"}`,
		"{\"v\":1,\"id\":\""+id+"\",\"uid\":\"alice\",\"deadline_ms\":1763720000123,\"text\":\"\xff\xfe\"}",
		"{\"v\":1,\"id\":\""+id+"\",\"uid\":\"alice\",\"deadline_ms\":1763720000123,\"text\":\"tab\there\x7f\"}",
		`{"\u0076":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123}`,
		// Keys of another case, unknown keys.
		`{"V":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123}`,
		`{"v":1,"ID":"`+id+`","Uid":"alice","DEADLINE_MS":1763720000123}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"ſource":"sweep"}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"extra":{"a":[1,2]}}`,
		// Duplicates: the last wins in encoding/json.
		`{"v":1,"v":3,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123}`,
		`{"v":3,"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123}`,
		`{"v":1,"id":"`+id+`","uid":"bob","uid":"alice","deadline_ms":1763720000123}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"V":2}`,
		// Nulls, wrong types, nested values.
		`{"v":null,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123}`,
		`{"v":1,"id":"`+id+`","uid":"alice","segment":null,"deadline_ms":1763720000123}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"final":null}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":"1763720000123"}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"final":"false"}`,
		`{"v":1,"id":"`+id+`","uid":["alice"],"deadline_ms":1763720000123}`,
		`{"v":{"n":1}}`, `[1]`, `null`, `"v"`, `1`, ``, `{}`, `{"v":1}`, `{"v":3}`, `{"v":2,"x":}`,
		// Numbers: bounds, forms encoding/json refuses for an integer.
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":9223372036854775807,"due_ms":9223372036854775807}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":9223372036854775808}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"detected_ms":-9223372036854775808}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"detected_ms":-9223372036854775809}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"detected_ms":-0}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"detected_ms":00}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1.763720000123e12}`,
		`{"v":1.0,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"stage":1E0}`,
		`{"v":+1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123}`,
		`{"v":99999999999999999999,"id":"`+id+`"}`,
		`{"v":-1}`,
		// Trailing bytes, truncation, bad punctuation.
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123}x`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123}{}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123`,
		`{"v":1 "id":"`+id+`"}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"final":truex}`,
		`{"v":1,"id":"`+id+`","uid":"alice","deadline_ms":1763720000123,"final":True}`,
	)
}

// FuzzParsePlain checks Parse against encoding/json alone on arbitrary
// bytes, and parsePlain's event against encoding/json's where it reads one.
func FuzzParsePlain(f *testing.F) {
	for _, s := range codecSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(sameAsEncodingJSON)
}

func TestParseAsEncodingJSON(t *testing.T) {
	for _, s := range codecSeeds() {
		sameAsEncodingJSON(t, []byte(s))
	}
}

// TestParsePlainBounds: which records parsePlain reads; encoding/json
// reads the others, and Parse's result is the same either way.
func TestParsePlainBounds(t *testing.T) {
	const id = `"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice"`
	tests := []struct {
		in    string
		plain bool
	}{
		{`{"v":1,` + id + `,"deadline_ms":1763720000123}`, true},
		{" \n{\t\"v\" :1 ,\r" + id + `,"deadline_ms": 1763720000123 } ` + "\n", true},
		{`{"v":1}`, true}, // no uid: complete refuses it
		{`{"v":3}`, true}, // known refuses it
		{`{}`, false},     // no version: encoding/json's path says so
		{`{"uid":"alice"}`, false},
		{``, false},
		{`   `, false},
		{`{`, false},
		{`{"v":1`, false},
		{`{"v":1,}`, false},
		{`{,"v":1}`, false},
		{`{"v":1}}`, false},
		{`{"v":1} x`, false},
		{`{"v":1}{"v":1}`, false},
		{`{"v"=1}`, false},
		{`["v",1]`, false},

		// Numbers.
		{`{"v":1,"deadline_ms":9223372036854775807}`, true},
		{`{"v":1,"deadline_ms":9223372036854775808}`, false},
		{`{"v":1,"deadline_ms":-9223372036854775808}`, true},
		{`{"v":1,"deadline_ms":-9223372036854775809}`, false},
		{`{"v":1,"deadline_ms":10000000000000000000}`, false},
		{`{"v":1,"deadline_ms":-0}`, true},
		{`{"v":1,"deadline_ms":0}`, true},
		{`{"v":1,"deadline_ms":01}`, false},
		{`{"v":1,"deadline_ms":-}`, false},
		{`{"v":1,"deadline_ms":+1}`, false},
		{`{"v":1,"deadline_ms":1.0}`, false},
		{`{"v":1,"deadline_ms":1.}`, false},
		{`{"v":1,"deadline_ms":1e3}`, false},
		{`{"v":1,"deadline_ms":1E3}`, false},
		{`{"v":1,"deadline_ms":0x1}`, false},
		{`{"v":1,"deadline_ms":"1"}`, false},
		{`{"v":1,"deadline_ms":null}`, false},
		{`{"v":1,"stage":` + strconv.Itoa(math.MaxInt) + `}`, true},
		{`{"v":1,"stage":` + strconv.FormatUint(math.MaxInt+1, 10) + `}`, false},
		{`{"v":` + strconv.Itoa(math.MinInt) + `}`, true},

		// Strings.
		{`{"v":1,"text":" !#$%&'()*+,-./09:;<=>?@AZ[]^_` + "`" + `az{|}~"}`, true},
		{`{"v":1,"text":""}`, true},
		{`{"v":1,"text":"\""}`, false},
		{`{"v":1,"text":"\\"}`, false},
		{`{"v":1,"text":"\/"}`, false},
		{`{"v":1,"text":"\u0041"}`, false},
		{"{\"v\":1,\"text\":\"\x1f\"}", false},
		{"{\"v\":1,\"text\":\"\x7f\"}", false},
		{"{\"v\":1,\"text\":\"\t\"}", false},
		{`{"v":1,"text":"é"}`, false},
		{"{\"v\":1,\"text\":\"\xff\"}", false},
		{`{"v":1,"text":"open}`, false},
		{`{"v":1,"text":1}`, false},
		{`{"v":1,"text":null}`, false},
		{`{"v":1,"text":{}}`, false},
		{`{"v":1,"text":[]}`, false},

		// Bools.
		{`{"v":1,"final":true}`, true},
		{`{"v":1,"final":false}`, true},
		{`{"v":1,"final":True}`, false},
		{`{"v":1,"final":tru}`, false},
		{`{"v":1,"final":truee}`, false},
		{`{"v":1,"final":1}`, false},
		{`{"v":1,"final":"true"}`, false},

		// Keys: exactly the struct's, once each.
		{`{"V":1}`, false},
		{`{"v":1,"ID":"x"}`, false},
		{`{"v":1,"Text":"x"}`, false},
		{`{"v":1,"deadline_MS":1}`, false},
		{`{"v":1,"version":1}`, false},
		{`{"v":1,"":1}`, false},
		{`{"\u0076":1}`, false},
		{`{"v":1,"v":1}`, false},
		{`{"v":1,"text":"a","text":"a"}`, false},
		{`{"v":1,"final":false,"final":false}`, false},
		{`{v:1}`, false},
	}
	for _, tt := range tests {
		if _, ok := parsePlain([]byte(tt.in)); ok != tt.plain {
			t.Errorf("parsePlain(%q): ok %v, want %v", tt.in, ok, tt.plain)
		}
		sameAsEncodingJSON(t, []byte(tt.in))
	}
}

// TestListenerRecordsArePlain: the records the listener writes, at every
// stage and action, with a text or without, are encoded and read by hand,
// not by encoding/json.
func TestListenerRecordsArePlain(t *testing.T) {
	d := time.UnixMilli(1_763_720_000_123)
	n := 0
	for _, source := range []string{SourceSweep, SourceEvent} {
		first := New("user-0001234", "default", d, d.Add(80*time.Millisecond), source)
		for stage := 1; stage <= MaxStages; stage++ {
			for _, action := range []string{ActionRemind, ActionClose, ActionNotify} {
				for _, text := range []string{"", "We haven't heard from you for a while, so we've closed this chat. Write to us again any time."} {
					if action == ActionNotify && text != "" {
						continue
					}
					for _, last := range []bool{false, true} {
						e := first.AtStage(stage, d.Add(time.Duration(stage)*time.Minute), action, text, last)
						if stage == 1 && action == ActionRemind && text == "" && !last {
							e = first
						}
						b, ok := marshalPlain(&e)
						if !ok {
							t.Fatalf("%+v: not encoded by hand", e)
						}
						if want, _ := json.Marshal(e); !bytes.Equal(b, want) {
							t.Fatalf("encoded by hand %s, json.Marshal %s", b, want)
						}
						if got, ok := parsePlain(b); !ok || got != e {
							t.Fatalf("parsePlain(%s) = %+v, %v; want %+v", b, got, ok, e)
						}
						if got, err := Parse(b); err != nil || got != e {
							t.Fatalf("Parse(%s) = %+v, %v", b, got, err)
						}
						n++
					}
				}
			}
		}
	}
	t.Logf("%d records", n)
}

// FuzzMarshal checks Marshal's bytes against json.Marshal's for arbitrary
// events, and that a record encoded by hand is read by hand.
func FuzzMarshal(f *testing.F) {
	d := time.UnixMilli(1_763_720_000_123)
	e := New("alice", "vip", d, d.Add(80*time.Millisecond), SourceSweep)
	events := []Event{
		e,
		e.AtStage(2, d.Add(time.Minute), ActionRemind, "Still there?", true),
		e.AtStage(2, d.Add(time.Minute), ActionNotify, "", false),
		e.AtStage(3, d.Add(2*time.Minute), ActionClose, "We haven't heard from you; closed.", true),
		{Version: -1 << 63, DeadlineMS: -1 << 63, DetectedMS: 1<<63 - 1, Stage: 1<<63 - 1, DueMS: -1, Reason: "~ ", Text: "}"},
		{},
	}
	// One character json.Marshal escapes or replaces, in each string.
	for _, c := range []string{`"`, `\`, "<", ">", "&", "\t", "\x00", "\x7f", "é", "\u2028", "\xff"} {
		s := "a" + c + "b"
		events = append(events,
			Event{ID: s}, Event{UID: s}, Event{Segment: s}, Event{Source: s},
			Event{Action: s}, Event{Reason: s}, e.AtStage(2, d.Add(time.Minute), ActionRemind, s, true))
	}
	for _, ev := range events {
		f.Add(ev.Version, ev.ID, ev.UID, ev.Segment, ev.DeadlineMS, ev.DetectedMS, ev.Source, ev.Stage, ev.DueMS, ev.Action, ev.Final, ev.Reason, ev.Text)
	}
	f.Fuzz(func(t *testing.T, v int, id, uid, segment string, deadline, detected int64, source string, stage int, due int64, action string, final bool, reason, text string) {
		e := Event{v, id, uid, segment, deadline, detected, source, stage, due, action, final, reason, text}
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.Marshal()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("Marshal(%+v) = %s, %v; json.Marshal: %s", e, got, err, want)
		}
		if b, ok := marshalPlain(&e); ok {
			if back, ok := parsePlain(b); !ok || back != e {
				t.Fatalf("parsePlain(%s) = %+v, %v; want %+v", b, back, ok, e)
			}
		} else if plainAll := !strings.ContainsFunc(id+uid+segment+source+action+reason+text, func(r rune) bool {
			return r < 0x20 || r > 0x7e || strings.ContainsRune(`"\<>&`, r)
		}); plainAll {
			t.Fatalf("%+v: plain strings, not encoded by hand", e)
		}
	})
}
