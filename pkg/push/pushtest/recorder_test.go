package pushtest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

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
