package policy

import (
	"flag"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
)

func TestClosing(t *testing.T) {
	bind := func(env map[string]string) (Closing, error) {
		var c Closing
		b := config.NewBinder(flag.NewFlagSet("test", flag.ContinueOnError), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		c.Bind(b)
		if err := b.Parse(nil); err != nil {
			return c, err
		}
		return c, c.Validate()
	}
	def, err := bind(nil)
	if err != nil || def.After != 3*time.Minute || def.Text != DefaultCloseText {
		t.Fatalf("defaults: %+v, %v", def, err)
	}
	want := []Stage{{Action: remindAction}, {After: 3 * time.Minute, Action: closeAction, Text: DefaultCloseText}}
	if got := def.Stages(); !slices.Equal(got, want) {
		t.Fatalf("default stages %v, want %v", got, want)
	}
	p := Fallback(time.Minute, 5*time.Second, def)
	if err := p.Validate(); err != nil {
		t.Fatalf("the fallback policy: %v", err)
	}
	if got := p.Stages("vip"); !slices.Equal(got, want) || p.TTL("vip") != time.Minute || p.Jitter != 5*time.Second {
		t.Fatalf("the fallback policy: %v, stages of vip %v", p, got)
	}

	set, err := bind(map[string]string{"STILLTHERE_CLOSE_AFTER": "30s", "STILLTHERE_CLOSE_TEXT": "Bye."})
	if err != nil || set.After != 30*time.Second || set.Text != "Bye." {
		t.Fatalf("from the environment: %+v, %v", set, err)
	}
	never, err := bind(map[string]string{"STILLTHERE_CLOSE_AFTER": "0"})
	if err != nil {
		t.Fatal(err)
	}
	if got := never.Stages(); !slices.Equal(got, []Stage{{Action: remindAction}}) {
		t.Fatalf("close-after 0: stages %v, want one reminder", got)
	}
	if p := Fallback(time.Minute, 0, never); p.SegmentStages != nil {
		t.Fatalf("close-after 0: the fallback lists stages %v, want none (one reminder)", p.SegmentStages)
	}

	for _, tt := range []struct {
		c    Closing
		want string
	}{
		{Closing{After: 500 * time.Millisecond, Text: "t"}, "close-after: 500ms, want 0 (no close stage) or between 1s and 24h"},
		{Closing{After: 25 * time.Hour, Text: "t"}, "close-after: 25h0m0s"},
		{Closing{After: -time.Second, Text: "t"}, "close-after: -1s"},
		{Closing{After: time.Second + time.Microsecond, Text: "t"}, "close-after: 1.000001s, want whole milliseconds"},
		{Closing{After: time.Minute}, "close-text: empty"},
		{Closing{After: time.Minute, Text: strings.Repeat("x", 1025)}, "close-text: text of 1025 bytes"},
		{Closing{After: time.Minute, Text: "\xff"}, "close-text: text \"\\xff\": not valid UTF-8"},
	} {
		if err := tt.c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: Validate = %v, want an error about %q", tt.c, err, tt.want)
		}
	}
	if _, err := bind(map[string]string{"STILLTHERE_CLOSE_AFTER": "soon"}); err == nil || !strings.Contains(err.Error(), "STILLTHERE_CLOSE_AFTER") {
		t.Errorf("close-after soon: %v, want an error naming the variable", err)
	}
}
