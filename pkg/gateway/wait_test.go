package gateway

import (
	"testing"
	"time"
)

// waitUntil polls cond until it holds, and fails the test after 15 s
// without it. Tests wait on what they need this way, never on a fixed
// sleep that assumes a fast machine.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !waitFor(15*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// waitFor is waitUntil for a caller with its own bound, or more to say
// when cond did not hold: it polls cond for up to d and reports whether
// it held.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
