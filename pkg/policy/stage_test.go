package policy

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

const (
	remindAction = timeoutevent.ActionRemind
	closeAction  = timeoutevent.ActionClose
	notifyAction = timeoutevent.ActionNotify
)

// withStages is a valid policy with segment's stages.
func withStages(segment string, stages ...Stage) Policy {
	return Policy{DefaultTTL: time.Minute, SegmentStages: map[string][]Stage{segment: stages}}
}

func TestValidateStages(t *testing.T) {
	long := strings.Repeat("x", timeoutevent.MaxTextLen+1)
	ten := []Stage{{}}
	for len(ten) < timeoutevent.MaxStages {
		ten = append(ten, Stage{After: time.Minute, Text: "still there?"})
	}
	eleven := append(slices.Clone(ten), Stage{After: time.Minute, Text: "still there?"})
	tests := []struct {
		name string
		p    Policy
		want []string // substrings of the error; nil means valid
	}{
		{"one reminder with the consumer's text", withStages("default", Stage{}), nil},
		{"reminder then close", withStages("default", Stage{Action: remindAction}, Stage{After: 3 * time.Minute, Action: closeAction, Text: "Closed."}), nil},
		{"close at the deadline", withStages("vip", Stage{Action: closeAction, Text: "Closed."}), nil},
		{"two reminders, no close", withStages("vip", Stage{Text: "Still there?"}, Stage{After: 5 * time.Minute, Text: "Still with us?"}), nil},
		{"reminder, notify, close", withStages("vip", Stage{Text: "Still there?"}, Stage{After: time.Minute, Action: notifyAction}, Stage{After: 5 * time.Minute, Action: closeAction, Text: "Closed."}), nil},
		{"notify alone", withStages("vip", Stage{Action: notifyAction}), nil},
		{"shortest and longest delays", withStages("x", Stage{}, Stage{After: time.Second, Text: "a"}, Stage{After: 24 * time.Hour, Text: "b"}), nil},
		{"text at the limit", withStages("x", Stage{Text: long[1:]}), nil},
		{"the most stages", withStages("x", ten...), nil},

		{"no stages", withStages("vip"), []string{"segment vip: 0 stages, want 1-10"}},
		{"too many stages", withStages("vip", eleven...), []string{"segment vip: 11 stages, want 1-10"}},
		{"stage 1 with a delay", withStages("vip", Stage{After: time.Second}), []string{"segment vip stage 1: after 1s", "stage 1 fires at the deadline"}},
		{"later stage without a delay", withStages("vip", Stage{}, Stage{Text: "t"}), []string{"segment vip stage 2: after 0s, want between 1s and 24h0m0s"}},
		{"later stage too soon", withStages("vip", Stage{}, Stage{After: 999 * time.Millisecond, Text: "t"}), []string{"segment vip stage 2: after 999ms"}},
		{"later stage too late", withStages("vip", Stage{}, Stage{After: 25 * time.Hour, Text: "t"}), []string{"segment vip stage 2: after 25h0m0s"}},
		{"sub-millisecond delay", withStages("vip", Stage{}, Stage{After: time.Second + time.Microsecond, Text: "t"}), []string{"segment vip stage 2: after 1.000001s, want whole milliseconds"}},
		{"unknown action", withStages("vip", Stage{Action: "nudge"}), []string{`segment vip stage 1: action "nudge", want "remind", "close" or "notify"`}},
		{"close before the last", withStages("vip", Stage{Action: closeAction, Text: "c"}, Stage{After: time.Minute, Text: "r"}), []string{"segment vip stage 1: close, but 1 more stages follow", "the last"}},
		{"two closes", withStages("vip", Stage{}, Stage{After: time.Minute, Action: closeAction, Text: "c"}, Stage{After: time.Minute, Action: closeAction, Text: "c"}), []string{"segment vip stage 2: close, but 1 more"}},
		{"text too long", withStages("vip", Stage{Text: long}), []string{"segment vip stage 1: text of 1025 bytes, want at most 1024"}},
		{"text not UTF-8", withStages("vip", Stage{Text: "\xff"}), []string{"segment vip stage 1", "not valid UTF-8"}},
		{"later stage without text", withStages("vip", Stage{}, Stage{After: time.Minute}), []string{"segment vip stage 2: no text"}},
		{"close without text", withStages("vip", Stage{Action: closeAction}), []string{"segment vip stage 1: close with no text"}},
		{"notify with text", withStages("vip", Stage{}, Stage{After: time.Minute, Action: notifyAction, Text: "away"}), []string{"segment vip stage 2: notify with a text"}},
		{"bad segment name", withStages("v i p", Stage{}), []string{`stages of segment "v i p"`}},
		{"first bad segment in name order", Policy{DefaultTTL: time.Minute, SegmentStages: map[string][]Stage{"b": nil, "a": nil}}, []string{"segment a: 0 stages"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want an error naming %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %v, want it to name %q", err, w)
				}
			}
		})
	}
}

func TestStagesOfASegment(t *testing.T) {
	closing := []Stage{{}, {After: 3 * time.Minute, Action: closeAction, Text: "Closed."}}
	vip := []Stage{{Text: "Still there?"}, {After: 5 * time.Minute, Text: "Still with us?"}}
	p := Policy{DefaultTTL: time.Minute, SegmentStages: map[string][]Stage{"default": closing, "vip": vip}}
	normalized := []Stage{{Action: remindAction}, closing[1]}
	if got := p.Stages("default"); !slices.Equal(got, normalized) {
		t.Errorf("Stages(default) = %v, want %v (empty actions are remind)", got, normalized)
	}
	if got := p.Stages("new"); !slices.Equal(got, normalized) {
		t.Errorf("Stages(new) = %v, want the default segment's %v", got, normalized)
	}
	if got := p.Stages("vip"); got[0].Action != remindAction || got[1].Action != remindAction || got[1].After != 5*time.Minute {
		t.Errorf("Stages(vip) = %v, want its own", got)
	}
	got := p.Stages("vip")
	got[0].Text = "changed"
	if p.SegmentStages["vip"][0].Text != "Still there?" {
		t.Error("changing the returned stages changed the policy")
	}
	one := []Stage{{Action: remindAction}}
	for _, q := range []Policy{{DefaultTTL: time.Minute}, withStages("vip", vip...)} {
		if got := q.Stages("default"); !slices.Equal(got, one) {
			t.Errorf("%v: Stages(default) = %v, want one reminder with the consumer's text", q, got)
		}
	}
}

func TestStagesJSON(t *testing.T) {
	p := Policy{DefaultTTL: time.Minute, Jitter: 5 * time.Second, SegmentStages: map[string][]Stage{
		"default": {{}, {After: 3 * time.Minute, Action: closeAction, Text: "We closed this chat."}},
		"vip":     {{Text: "Still there?"}, {After: 90 * time.Second, Text: "Still with us?"}},
	}}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"default_ttl":"1m0s","jitter":"5s","stages":{` +
		`"default":[{"action":"remind"},{"after":"3m0s","action":"close","text":"We closed this chat."}],` +
		`"vip":[{"action":"remind","text":"Still there?"},{"after":"1m30s","action":"remind","text":"Still with us?"}]}}`
	if string(b) != want {
		t.Fatalf("Marshal =\n%s\nwant\n%s", b, want)
	}
	var back Policy
	if err := json.Unmarshal(b, &back); err != nil || !back.Equal(p) || back.String() != p.String() {
		t.Fatalf("round trip = %v, %v", back, err)
	}

	// Documents from before stages load, with one reminder per silence.
	var old Policy
	if err := json.Unmarshal([]byte(`{"default_ttl":"60s","jitter":"5s","segments":{"vip":"180s"}}`), &old); err != nil {
		t.Fatal(err)
	}
	if old.SegmentStages != nil || !slices.Equal(old.Stages("vip"), []Stage{{Action: remindAction}}) {
		t.Fatalf("an old document: stages %v", old.SegmentStages)
	}
	// An empty map is no stages, as stored by nobody but read the same.
	if err := json.Unmarshal([]byte(`{"default_ttl":"60s","jitter":"5s","stages":{}}`), &old); err != nil || old.SegmentStages != nil {
		t.Fatalf("empty stages: %v, %v", old.SegmentStages, err)
	}
	// Stage 1's delay may be written as 0, and a missing action is remind.
	var short Policy
	if err := json.Unmarshal([]byte(`{"default_ttl":"60s","jitter":"5s","stages":{"vip":[{"after":"0s"},{"after":"2s","text":"t"}]}}`), &short); err != nil {
		t.Fatal(err)
	}
	if got := short.SegmentStages["vip"]; got[0] != (Stage{Action: remindAction}) || got[1] != (Stage{After: 2 * time.Second, Action: remindAction, Text: "t"}) {
		t.Fatalf("decoded %v", got)
	}

	for _, bad := range []struct{ doc, want string }{
		{`{"default_ttl":"60s","jitter":"5s","stages":{"vip":[{"wait":"3m"}]}}`, `segment vip stage 1: want an object such as {"after": "3m", "action": "close", "text": "Closed."}: json: unknown field "wait"`},
		{`{"default_ttl":"60s","jitter":"5s","stages":{"vip":[{},{"after":"3","text":"t"}]}}`, `segment vip stage 2: after "3": not a duration such as 3m`},
		{`{"default_ttl":"60s","jitter":"5s","stages":{"vip":[{},{"after":"1m"}]}}`, "segment vip stage 2: no text"},
		{`{"default_ttl":"60s","jitter":"5s","stages":{"vip":[]}}`, "segment vip: 0 stages"},
		{`{"default_ttl":"60s","jitter":"5s","stages":{"vip":null}}`, "segment vip: 0 stages"},
		{`{"default_ttl":"60s","jitter":"5s","stages":{"vip":[{"action":"close"}]}}`, "close with no text"},
		{`{"default_ttl":"60s","jitter":"5s","stages":{"vip":{}}}`, "segment vip stages {}: want an array such as"},
		{`{"default_ttl":"60s","jitter":"5s","stages":{"vip":[{},{"text":1}]}}`, "segment vip stage 2: want an object"},
	} {
		if err := json.Unmarshal([]byte(bad.doc), &back); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Unmarshal(%s) = %v, want an error about %q", bad.doc, err, bad.want)
		}
	}
}

func TestParseStages(t *testing.T) {
	got, err := ParseStages("default", `[{"text": "Still there?"}, {"after": "3m", "action": "close", "text": "Closed."}]`)
	want := []Stage{{Action: remindAction, Text: "Still there?"}, {After: 3 * time.Minute, Action: closeAction, Text: "Closed."}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("ParseStages = %v, %v; want %v", got, err, want)
	}
	for _, tt := range []struct{ list, want string }{
		{``, `segment vip stages "": not JSON; want an array such as [{"text": "Still there?"}`},
		{`{"text": "t"}`, `segment vip stages {"text": "t"}: want an array such as`},
		{`[{}] x`, `segment vip stages "[{}] x": not JSON`},
		{`[{}, {"after": "3"}]`, `segment vip stage 2: after "3": not a duration`},
		{`[{}, {"after": "3m", "txt": "t"}]`, `segment vip stage 2: want an object such as`},
		{`null`, "segment vip: 0 stages"},
		{`[]`, "segment vip: 0 stages"},
		{`[{"after": "1m"}]`, "segment vip stage 1: after 1m0s"},
		{`[{"action": "close", "text": "c"}, {"after": "1m", "text": "r"}]`, "segment vip stage 1: close, but 1 more"},
	} {
		if _, err := ParseStages("vip", tt.list); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseStages(%q) = %v, want an error about %q", tt.list, err, tt.want)
		}
	}
}

func FuzzParseStages(f *testing.F) {
	f.Add(`[{"text": "Still there?"}, {"after": "3m", "action": "close", "text": "Closed."}]`)
	f.Add(`[{}, {"after": "1s", "text": "a"}, {"after": "24h", "action": "remind", "text": "b"}]`)
	f.Add(`[{"action": "close", "text": "closed"}]`)
	f.Add(`[{"action": "notify"}, {"after": "1m", "action": "notify"}]`)
	f.Add(`[{"after": "0s", "action": "", "text": ""}]`)
	f.Fuzz(func(t *testing.T, list string) {
		stages, err := ParseStages("vip", list)
		if err != nil {
			return
		}
		if err := checkStages("vip", stages); err != nil {
			t.Fatalf("parsed invalid stages %v: %v", stages, err)
		}
		for _, s := range stages {
			if s.Action == "" {
				t.Fatalf("parsed an empty action: %v", stages)
			}
		}
		out, err := json.Marshal(stages)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseStages("vip", string(out))
		if err != nil || !slices.Equal(again, stages) {
			t.Fatalf("re-parse of %s: %v, %v; want %v", out, again, err, stages)
		}
	})
}
