package policy

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestWatcherSeesStageChanges: stages come along with the policy, live,
// also when only a text changes, and also for a watcher that checks no
// granularity (an expiry listener's); it starts from the configured
// close stage while none is stored.
func TestWatcherSeesStageChanges(t *testing.T) {
	store, _ := newStore(t)
	ctx := context.Background()
	var logs lockedBuffer
	fallback := Fallback(0, 0, Closing{After: 3 * time.Minute, Text: "Closed."})
	w := NewWatcher(store, fallback, 10*time.Millisecond, 0, slog.New(slog.NewTextHandler(&logs, nil)))
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.Run(wctx); close(done) }()
	defer func() { cancel(); <-done }()

	want := []Stage{{Action: remindAction}, {After: 3 * time.Minute, Action: closeAction, Text: "Closed."}}
	if got := w.Current().Stages("vip"); !slices.Equal(got, want) {
		t.Fatalf("none stored: Stages(vip) = %v, want the configured %v", got, want)
	}

	vip := []Stage{{Text: "Still there?"}, {After: 5 * time.Second, Text: "Still with us? We are here whenever you are ready."}}
	p := Policy{DefaultTTL: time.Second, SegmentStages: map[string][]Stage{"vip": vip}}
	for round, change := range []func(){
		func() {},
		// Past the part of the text String shows.
		func() { p.SegmentStages["vip"][1].Text = "Still with us? We are here whenever you like." },
		func() {
			p.SegmentStages["vip"] = append(p.SegmentStages["vip"], Stage{After: time.Minute, Action: closeAction, Text: "Closed."})
		},
		func() { delete(p.SegmentStages, "vip") },
	} {
		change()
		if err := store.Save(ctx, p); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return slices.Equal(w.Current().Stages("vip"), p.Stages("vip")) })
		if n := strings.Count(logs.String(), "timeout policy in force"); n != round+1 {
			t.Errorf("round %d: %d lines naming the policy in force, want one per change:\n%s", round, n, logs.String())
		}
	}
	// A TTL of 1s is under twice a gateway's usual granularity; with none
	// checked, the policy applies.
	if got := w.Current().TTL("vip"); got != time.Second {
		t.Errorf("TTL(vip) = %v, want the stored 1s", got)
	}
	if got := w.Current().Stages("vip"); !slices.Equal(got, []Stage{{Action: remindAction}}) {
		t.Errorf("stages all removed: Stages(vip) = %v, want one reminder", got)
	}
}

// TestWatcherFallbackWithoutClose: close-after 0 gives one reminder while
// none is stored.
func TestWatcherFallbackWithoutClose(t *testing.T) {
	store, _ := newStore(t)
	w := NewWatcher(store, Fallback(time.Minute, 0, Closing{}), time.Second, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := w.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := w.Current().Stages("default"); !slices.Equal(got, []Stage{{Action: remindAction}}) {
		t.Fatalf("Stages(default) = %v, want one reminder", got)
	}
}
