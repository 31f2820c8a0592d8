package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// TestClock: a segment's own clock, else the default segment's, else the
// presence clock; bad clocks and names are refused; the clocks survive
// JSON, and a document without them loads with none.
func TestClock(t *testing.T) {
	base := Policy{DefaultTTL: time.Minute}
	for _, tc := range []struct {
		name   string
		clocks map[string]session.Clock
		seg    string
		want   session.Clock
	}{
		{"none", nil, "vip", session.ClockPresence},
		{"own", map[string]session.Clock{"vip": session.ClockTurn}, "vip", session.ClockTurn},
		{"another's", map[string]session.Clock{"vip": session.ClockTurn}, "chat", session.ClockPresence},
		{"the default's", map[string]session.Clock{"default": session.ClockTurn}, "chat", session.ClockTurn},
		{"own over the default's", map[string]session.Clock{"default": session.ClockTurn, "vip": session.ClockPresence}, "vip", session.ClockPresence},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := base
			p.Clocks = tc.clocks
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := p.Clock(tc.seg); got != tc.want {
				t.Fatalf("Clock(%q) = %q, want %q", tc.seg, got, tc.want)
			}
			b, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			var back Policy
			if err := json.Unmarshal(b, &back); err != nil || !back.Equal(p) || back.Clock(tc.seg) != tc.want {
				t.Fatalf("JSON round trip of %s: %v, %v", b, back, err)
			}
		})
	}
	for _, bad := range []map[string]session.Clock{
		{"vip": "wall"}, {"vip": ""}, {"bad name": session.ClockTurn},
	} {
		p := base
		p.Clocks = bad
		if err := p.Validate(); err == nil {
			t.Errorf("Validate accepted clocks %v", bad)
		}
	}
	var old Policy
	if err := json.Unmarshal([]byte(`{"default_ttl": "60s", "jitter": "0s"}`), &old); err != nil || old.Clocks != nil || old.Clock("x") != session.ClockPresence {
		t.Fatalf("a document from before clocks: %+v, %v", old, err)
	}
	if err := json.Unmarshal([]byte(`{"default_ttl": "60s", "jitter": "0s", "clocks": {"vip": "sundial"}}`), &old); err == nil {
		t.Fatal("a stored clock that is none was loaded")
	}
}

// TestCommandClock: "set -clock" stores a segment's clock, validated,
// "show" prints it, and a watcher picks it up live.
func TestCommandClock(t *testing.T) {
	store, env := newStore(t)
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ctx := context.Background()
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := Command(ctx, args, lookup, &out)
		return out.String(), err
	}
	w := NewWatcher(store, Fallback(time.Minute, 0, Closing{}), 10*time.Millisecond, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.Run(wctx); close(done) }()
	defer func() { cancel(); <-done }()

	out, err := run("set", "-clock", "support=turn")
	if err != nil {
		t.Fatalf("set -clock: %v\n%s", err, out)
	}
	if !strings.Contains(out, `"clocks": {`) || !strings.Contains(out, "  support: turn") || !strings.Contains(out, "any other segment: presence") {
		t.Fatalf("set's report: %s", out)
	}
	waitFor(t, func() bool { return w.Current().Clock("support") == session.ClockTurn })
	if w.Current().Clock("other") != session.ClockPresence {
		t.Fatal("another segment's clock changed")
	}
	for _, bad := range []string{"support=sundial", "support", "bad name=turn", "support="} {
		if out, err := run("set", "-clock", bad); err == nil || !strings.Contains(err.Error(), "policy not changed") {
			t.Fatalf("set -clock %q: %v\n%s", bad, err, out)
		}
	}
	if _, err := run("set", "-clock", "default=turn", "-clock", "support=presence"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return w.Current().Clock("other") == session.ClockTurn })
	if got := w.Current().Clock("support"); got != session.ClockPresence {
		t.Fatalf("support's own clock: %q", got)
	}
	out, err = run("show")
	if err != nil || !strings.Contains(out, "  default: turn") || !strings.Contains(out, "  support: presence") || !strings.Contains(out, "any other segment: turn") {
		t.Fatalf("show: %s, %v", out, err)
	}
}
