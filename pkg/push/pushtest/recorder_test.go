package pushtest

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
)

func TestRecorderAnswersAsTheGateway(t *testing.T) {
	secret := strings.Repeat("s", push.MinSecretLen)
	r, url := Start(t, secret)
	c := push.NewClient(url, secret, http.DefaultClient)
	ctx := context.Background()
	req := push.Request{ID: "g1", UID: "ann", Text: "Still there?"}

	for _, want := range []push.Status{push.Delivered, push.Duplicate} {
		got, err := c.Push(ctx, req)
		if err != nil || got.Status != want {
			t.Fatalf("push: %+v, %v; want %s", got, err, want)
		}
	}
	if p, ok := r.Get("g1"); !ok || p.UID != "ann" || p.Sends != 2 || p.At.IsZero() {
		t.Errorf("recorded %+v, %v", p, ok)
	}

	r.SetDown(true)
	var perr *push.Error
	if _, err := c.Push(ctx, push.Request{ID: "g2", UID: "ann", Text: "Hi?"}); !errors.As(err, &perr) || perr.Code != http.StatusServiceUnavailable {
		t.Errorf("push while down: %v, want a 503", err)
	}
	r.SetDown(false)
	r.SetStatus("bob", http.StatusBadGateway)
	if _, err := c.Push(ctx, push.Request{ID: "g3", UID: "bob", Text: "Hi?"}); !errors.As(err, &perr) || perr.Code != http.StatusBadGateway {
		t.Errorf("push for bob: %v, want a 502", err)
	}
	if _, err := push.NewClient(url, secret+"x", http.DefaultClient).Push(ctx, req); !errors.As(err, &perr) || perr.Code != http.StatusUnauthorized {
		t.Errorf("push with the wrong secret: %v, want a 401", err)
	}

	if r.Delivered() != 1 || r.Refused() != 1 || r.Resent() != 1 {
		t.Errorf("delivered %d, refused %d, resent %d; want 1, 1, 1", r.Delivered(), r.Refused(), r.Resent())
	}
	if first, last := r.Span(); first.IsZero() || !first.Equal(last) {
		t.Errorf("span %v to %v, want one delivery", first, last)
	}
	r.ResetSpan()
	if first, _ := r.Span(); !first.IsZero() {
		t.Errorf("span after reset starts at %v", first)
	}
}

// waitUntil polls cond until it holds, failing the test after a
// deadline generous enough for a busy machine.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
	}
}

// TestRecorderFaults: a hang holds pushes until released (delivered) or
// their client gives up (abandoned); the hook runs once per id, before
// the answer; every push taken is counted, whatever its answer.
func TestRecorderFaults(t *testing.T) {
	secret := strings.Repeat("s", push.MinSecretLen)
	r, url := Start(t, secret)
	c := push.NewClient(url, secret, http.DefaultClient)
	ctx := context.Background()

	r.SetHang(true)
	answered := make(chan error, 1)
	go func() {
		_, err := c.Push(ctx, push.Request{ID: "held", UID: "ann", Text: "Still there?"})
		answered <- err
	}()
	waitUntil(t, "the push to be held", func() bool { now, _ := r.Concurrency(); return now == 1 })
	if r.Shown("held") || r.Attempts("held") != 1 {
		t.Errorf("held push: shown %v, attempts %d; want not shown, 1", r.Shown("held"), r.Attempts("held"))
	}
	gaveUp, cancel := context.WithCancel(ctx)
	go c.Push(gaveUp, push.Request{ID: "abandoned", UID: "bob", Text: "Hello?"})
	waitUntil(t, "both pushes to be held", func() bool { now, _ := r.Concurrency(); return now == 2 })
	cancel()
	waitUntil(t, "the given-up push to be abandoned", func() bool { return r.Abandoned() == 1 })
	r.SetHang(false)
	if err := <-answered; err != nil || !r.Shown("held") {
		t.Errorf("released push: %v, shown %v; want delivered", err, r.Shown("held"))
	}
	if r.Shown("abandoned") {
		t.Error("the abandoned push was delivered")
	}
	if now, peak := r.Concurrency(); now != 0 || peak != 2 {
		t.Errorf("concurrency now %d, peak %d; want 0 and 2", now, peak)
	}

	var mu sync.Mutex
	var hooked []string
	r.OnShown(func(id string) {
		mu.Lock()
		defer mu.Unlock()
		hooked = append(hooked, id)
	})
	for range 2 {
		if _, err := c.Push(ctx, push.Request{ID: "hooked", UID: "cy", Text: "Still there?"}); err != nil {
			t.Fatal(err)
		}
	}
	r.OnShown(nil)
	mu.Lock()
	defer mu.Unlock()
	if len(hooked) != 1 || hooked[0] != "hooked" {
		t.Errorf("hook ran for %v, want once for the first delivery", hooked)
	}
	if p, _ := r.Get("hooked"); p.Path != push.Path || p.Sends != 2 || r.ShownTo("cy") != 1 {
		t.Errorf("recorded %+v, shown to cy %d; want one guide on %s from two sends", p, r.ShownTo("cy"), push.Path)
	}

	push.NewClient(url, "wrong", http.DefaultClient).Push(ctx, push.Request{ID: "x", UID: "dan", Text: "Hi?"})
	if r.Unauthorized() != 1 || r.Attempts("x") != 0 {
		t.Errorf("unauthorized %d, attempts %d; want 1 and 0 (refused before it was taken)", r.Unauthorized(), r.Attempts("x"))
	}
	if got, want := r.Texts(), []string{"Hello?", "Still there?"}; !slices.Equal(got, want) {
		t.Errorf("texts %q, want %q", got, want)
	}
	if n := r.TotalAttempts(); n != 4 {
		t.Errorf("%d pushes taken, want 4", n)
	}
}
