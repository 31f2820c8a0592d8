package policy

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCommandStages: "set" handles stages per segment, "show" prints
// them, and refused stages leave the stored policy as it was.
func TestCommandStages(t *testing.T) {
	store, env := newStore(t)
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ctx := context.Background()
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := Command(ctx, args, lookup, &out)
		return out.String(), err
	}

	// None stored: the configured close stage applies, and "set" starts
	// from it.
	env["STILLTHERE_CLOSE_AFTER"] = "2m"
	env["STILLTHERE_CLOSE_TEXT"] = "Closed for now."
	out, err := run("show")
	if err != nil || !strings.Contains(out, "no policy stored") || !strings.Contains(out, `"after": "2m0s"`) ||
		!strings.Contains(out, `"text": "Closed for now."`) || !strings.Contains(out, `default: [remind, close after 2m0s "Closed for now."]`) {
		t.Fatalf("show with none stored: %q, %v", out, err)
	}
	if _, err := run("set", "-segment", "vip=180s"); err != nil {
		t.Fatal(err)
	}
	configured := []Stage{{Action: remindAction}, {After: 2 * time.Minute, Action: closeAction, Text: "Closed for now."}}
	if p, err := store.Load(ctx); err != nil || !slices.Equal(p.Stages("vip"), configured) {
		t.Fatalf("stored from the configured stages: %v, %v", p, err)
	}
	delete(env, "STILLTHERE_CLOSE_AFTER")
	delete(env, "STILLTHERE_CLOSE_TEXT")

	vip := `vip=[{"text": "Still there?"}, {"after": "90s", "text": "Still with us?"}, {"after": "1m", "text": "Last call."}]`
	out, err = run("set", "-stages", `default=[{}, {"after": "3m", "action": "close", "text": "We closed this chat."}]`, "-stages", vip)
	if err != nil {
		t.Fatalf("set -stages: %v\n%s", err, out)
	}
	p, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantVIP := []Stage{{Action: remindAction, Text: "Still there?"}, {After: 90 * time.Second, Action: remindAction, Text: "Still with us?"}, {After: time.Minute, Action: remindAction, Text: "Last call."}}
	wantDefault := []Stage{{Action: remindAction}, {After: 3 * time.Minute, Action: closeAction, Text: "We closed this chat."}}
	if !slices.Equal(p.Stages("vip"), wantVIP) || !slices.Equal(p.Stages("default"), wantDefault) || !slices.Equal(p.Stages("new"), wantDefault) {
		t.Fatalf("stored stages %v", p.SegmentStages)
	}
	if p.TTL("vip") != 180*time.Second {
		t.Fatalf("setting stages changed the TTLs: %v", p)
	}
	for _, want := range []string{`"stages": {`, `"text": "Still with us?"`, `vip: [remind "Still there?", remind after 1m30s "Still with us?", remind after 1m0s "Last call."]`, "any other segment: as default"} {
		if !strings.Contains(out, want) {
			t.Errorf("set's report does not show %q:\n%s", want, out)
		}
	}

	bad := []struct {
		name string
		args []string
		want string
	}{
		{"no segment", []string{"-stages", `[{}]`}, `-stages "[{}]": want name=[stage, ...]`},
		{"bad segment name", []string{"-stages", `v i p=[{}]`}, `-stages: segment "v i p"`},
		{"not JSON", []string{"-stages", `vip=remind`}, `-stages: segment vip stages "remind": not JSON; want an array such as`},
		{"bad delay", []string{"-stages", `vip=[{}, {"after": "5 min", "text": "t"}]`}, `-stages: segment vip stage 2: after "5 min": not a duration such as 3m`},
		{"unknown field", []string{"-stages", `vip=[{"delay": "1m"}]`}, `unknown field "delay"`},
		{"no stages", []string{"-stages", `vip=[]`}, "segment vip: 0 stages, want 1-10"},
		{"stage 1 delayed", []string{"-stages", `vip=[{"after": "1m"}]`}, "segment vip stage 1: after 1m0s"},
		{"later stage too soon", []string{"-stages", `vip=[{}, {"after": "500ms", "text": "t"}]`}, "segment vip stage 2: after 500ms, want between 1s and 24h"},
		{"later stage without text", []string{"-stages", `vip=[{}, {"after": "1m"}]`}, "segment vip stage 2: no text"},
		{"close not last", []string{"-stages", `vip=[{"action": "close", "text": "c"}, {"after": "1m", "text": "t"}]`}, "segment vip stage 1: close, but 1 more stages follow"},
		{"unknown action", []string{"-stages", `vip=[{"action": "transfer"}]`}, `segment vip stage 1: action "transfer"`},
		{"text too long", []string{"-stages", `vip=[{"text": "` + strings.Repeat("x", 1025) + `"}]`}, "segment vip stage 1: text of 1025 bytes, want at most 1024"},
		{"clear a segment without stages", []string{"-clear-stages", "new"}, `-clear-stages "new": the segment has no stages of its own`},
		{"good stages with a bad TTL", []string{"-stages", `new=[{}]`, "-segment", "new=100ms"}, "segment new TTL"},
		{"bad close-after for the fallback", []string{"-close-after", "10ms", "-stages", `new=[{}]`}, "close-after: 10ms"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			before, err := store.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := run(append([]string{"set"}, tt.args...)...); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%q: %v, want an error about %q", tt.args, err, tt.want)
			}
			if after, _ := store.Load(ctx); !after.Equal(before) {
				t.Errorf("%q changed the policy to %v", tt.args, after)
			}
		})
	}

	// Cleared, vip follows default; cleared too, one reminder.
	if _, err := run("set", "-clear-stages", "vip"); err != nil {
		t.Fatal(err)
	}
	if p, _ := store.Load(ctx); !slices.Equal(p.Stages("vip"), wantDefault) {
		t.Fatalf("vip cleared: stages %v, want the default segment's", p.Stages("vip"))
	}
	out, err = run("set", "-clear-stages", "default")
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := store.Load(ctx); p.SegmentStages != nil || !slices.Equal(p.Stages("vip"), []Stage{{Action: remindAction}}) {
		t.Fatalf("all cleared: %v", p.SegmentStages)
	}
	if strings.Contains(out, `"stages"`) || !strings.Contains(out, "any other segment: [remind], with the consumer's text") {
		t.Errorf("all cleared, set reports:\n%s", out)
	}
}
