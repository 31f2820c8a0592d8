package gateway

import (
	"testing"
	"time"
)

// patience is how long a test waits for what must come before it calls
// it missing: it returns as soon as it comes, so a long bound costs a
// passing run nothing, and a busy host (a CI runner, every core taken)
// may take seconds for what takes milliseconds here.
const patience = 15 * time.Second

// waitUntil polls cond until it holds, and fails the test after patience
// without it. Tests wait on what they need this way, never on a fixed
// sleep that assumes a fast machine.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !waitFor(patience, cond) {
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
