package policy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/userid"
)

// Stage is one step of a silence: a guide sent while the user stays
// silent. Stage 1 fires at the session's deadline, each later one After
// the one before; a ping cancels those not yet sent, and the user's next
// silence starts again at stage 1.
type Stage struct {
	// After is the delay from the stage before: 0 on stage 1, between
	// MinStageAfter and MaxStageAfter on the others.
	After time.Duration
	// Action is timeoutevent.ActionRemind (also when empty),
	// timeoutevent.ActionClose, which ends the chat and is always the
	// last stage, or timeoutevent.ActionNotify, which sends the user
	// nothing and tells the platform's notify webhook.
	Action string
	// Text is the guide's text, at most timeoutevent.MaxTextLen bytes.
	// Stage 1's may be empty: the guide consumer's text for the segment,
	// as before stages. Every other stage needs its own, and so does a
	// close stage: the consumer's text asks whether the user is still
	// there. A notify stage has none.
	Text string
}

// Bounds of the delay of a stage after the first.
const (
	MinStageAfter = time.Second
	MaxStageAfter = 24 * time.Hour
)

// remind is the one stage of a policy that lists none: a reminder at the
// deadline with the consumer's text, the behaviour from before stages.
var remind = Stage{Action: timeoutevent.ActionRemind}

// Stages are the stages of segment's silences: its own, else the default
// segment's, else one reminder at the deadline with the consumer's text.
// There is at least one, and no action is empty. The slice is the
// caller's.
func (p Policy) Stages(segment string) []Stage {
	stages, ok := p.SegmentStages[segment]
	if !ok || len(stages) == 0 {
		stages = p.SegmentStages[userid.DefaultSegment]
	}
	if len(stages) == 0 {
		return []Stage{remind}
	}
	out := slices.Clone(stages)
	for i := range out {
		out[i].Action = out[i].action()
	}
	return out
}

func (s Stage) action() string {
	if s.Action == "" {
		return timeoutevent.ActionRemind
	}
	return s.Action
}

// checkStages names the first bad stage of segment's list.
func checkStages(segment string, stages []Stage) error {
	if len(stages) < 1 || len(stages) > timeoutevent.MaxStages {
		return fmt.Errorf("segment %s: %d stages, want 1-%d", segment, len(stages), timeoutevent.MaxStages)
	}
	for i, s := range stages {
		n := i + 1
		what := fmt.Sprintf("segment %s stage %d", segment, n)
		switch {
		case n == 1 && s.After != 0:
			return fmt.Errorf("%s: after %v, want none: stage 1 fires at the deadline", what, s.After)
		case n > 1 && (s.After < MinStageAfter || s.After > MaxStageAfter):
			return fmt.Errorf("%s: after %v, want between %v and %v", what, s.After, MinStageAfter, MaxStageAfter)
		case s.After%time.Millisecond != 0:
			return fmt.Errorf("%s: after %v, want whole milliseconds", what, s.After)
		case !timeoutevent.ValidAction(s.action()):
			return fmt.Errorf("%s: action %q, want %q, %q or %q", what, s.Action, timeoutevent.ActionRemind, timeoutevent.ActionClose, timeoutevent.ActionNotify)
		case s.action() == timeoutevent.ActionClose && n < len(stages):
			return fmt.Errorf("%s: close, but %d more stages follow: a close stage ends the chat, so it is the last", what, len(stages)-n)
		}
		if err := checkText(s.Text); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		switch {
		case s.Text != "" && s.action() == timeoutevent.ActionNotify:
			return fmt.Errorf("%s: notify with a text: a notify stage sends the user nothing, only the platform's notify webhook hears of it", what)
		case s.action() == timeoutevent.ActionNotify:
		case s.Text == "" && s.action() == timeoutevent.ActionClose:
			return fmt.Errorf("%s: close with no text: the consumer's text asks whether the user is still there, not that the chat is closed", what)
		case s.Text == "" && n > 1:
			return fmt.Errorf("%s: no text: only stage 1 may leave it to the consumer's text for the segment", what)
		}
	}
	return nil
}

// checkText bounds a stage's text as the push endpoint does, and keeps it
// valid UTF-8, which JSON would otherwise alter on the way to the user.
func checkText(text string) error {
	if len(text) > timeoutevent.MaxTextLen {
		return fmt.Errorf("text of %d bytes, want at most %d", len(text), timeoutevent.MaxTextLen)
	}
	if !utf8.ValidString(text) {
		return fmt.Errorf("text %q: not valid UTF-8", text)
	}
	return nil
}

// storedStage is a stage's JSON form: the delay as a Go duration string,
// left out on stage 1.
type storedStage struct {
	After  string `json:"after,omitempty"`
	Action string `json:"action"`
	Text   string `json:"text,omitempty"`
}

// MarshalJSON encodes the stage as {"after": "3m0s", "action": "close",
// "text": "..."}, with an empty action as "remind".
func (s Stage) MarshalJSON() ([]byte, error) {
	out := storedStage{Action: s.action(), Text: s.Text}
	if s.After != 0 {
		out.After = s.After.String()
	}
	return json.Marshal(out)
}

// UnmarshalJSON decodes one stage, refusing unknown fields; a missing
// action is "remind". Where the stage may stand in its list is checked by
// Policy.Validate.
func (s *Stage) UnmarshalJSON(b []byte) error {
	var in storedStage
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return fmt.Errorf("want an object such as {\"after\": \"3m\", \"action\": \"close\", \"text\": \"Closed.\"}: %w", err)
	}
	var out Stage
	if in.After != "" {
		d, err := time.ParseDuration(in.After)
		if err != nil {
			return fmt.Errorf("after %q: not a duration such as 3m", in.After)
		}
		out.After = d
	}
	out.Action = cmp.Or(in.Action, timeoutevent.ActionRemind)
	out.Text = in.Text
	*s = out
	return nil
}

// ParseStages reads a segment's stage list as "gateway policy set
// -stages" takes it: a JSON array of stages, such as
//
//	[{"text": "Still there?"}, {"after": "3m", "action": "close", "text": "We closed this chat."}]
//
// and checks it as the list of segment.
func ParseStages(segment, list string) ([]Stage, error) {
	if !json.Valid([]byte(list)) {
		return nil, fmt.Errorf("segment %s stages %q: not JSON; want an array such as %s", segment, shorten(list, 64), stagesExample)
	}
	stages, err := decodeStages(segment, []byte(list))
	if err != nil {
		return nil, err
	}
	if err := checkStages(segment, stages); err != nil {
		return nil, err
	}
	return stages, nil
}

const stagesExample = `[{"text": "Still there?"}, {"after": "2m", "action": "notify"}, {"after": "3m", "action": "close", "text": "Closed."}]`

// decodeStages decodes segment's list from valid JSON, naming the stage
// that does not decode. Where each may stand in the list is checked by
// checkStages.
func decodeStages(segment string, list json.RawMessage) ([]Stage, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(list, &raw); err != nil {
		return nil, fmt.Errorf("segment %s stages %s: want an array such as %s", segment, shorten(string(list), 64), stagesExample)
	}
	var stages []Stage
	for i, r := range raw {
		var s Stage
		if err := json.Unmarshal(r, &s); err != nil {
			return nil, fmt.Errorf("segment %s stage %d: %w", segment, i+1, err)
		}
		stages = append(stages, s)
	}
	return stages, nil
}

// describe is a stage list in a line, texts cut short: for logs.
func describe(stages []Stage) string {
	parts := make([]string, len(stages))
	for i, s := range stages {
		var b strings.Builder
		b.WriteString(s.action())
		if s.After != 0 {
			fmt.Fprintf(&b, " after %v", s.After)
		}
		if s.Text != "" {
			fmt.Fprintf(&b, " %q", shorten(s.Text, 24))
		}
		parts[i] = b.String()
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// shorten cuts text to at most n runes, marking the cut.
func shorten(text string, n int) string {
	if utf8.RuneCountInString(text) <= n {
		return text
	}
	r := []rune(text)
	return string(r[:n]) + "…"
}
