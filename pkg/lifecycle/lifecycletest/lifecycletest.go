// Package lifecycletest runs a service in a test the one way the tests
// run the gateway, the expiry listener and the guide consumer: Open, Run
// on a goroutine of its own, and Close at cleanup, which stops Run and
// waits for it. The package's own tests of each service use it too, as it
// imports none of them.
package lifecycletest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/lifecycle"
)

// StopTimeout bounds a stop: Close drains the service (a gateway's drain
// takes up to its shutdown timeout) and waits for Run. A stop that takes
// longer fails the test with every goroutine's stack, to say where it
// hangs.
const StopTimeout = 20 * time.Second

// Opener is a service's Open: gateway.Open, expiry.Open and guide.Open
// all have this shape.
type Opener[C any, S lifecycle.Service] func(ctx context.Context, cfg C, logger *slog.Logger) (S, error)

// Start opens a service with cfg, calls each prepare with it before it
// runs (to set what only a test sets), runs it, and stops it at cleanup.
// A failed Open fails the test. Stop the service earlier with the
// returned Running.
func Start[C any, S lifecycle.Service](t testing.TB, open Opener[C, S], cfg C, logger *slog.Logger, prepare ...func(S)) (S, *Running) {
	t.Helper()
	svc, err := open(context.Background(), cfg, logger)
	if err != nil {
		t.Fatalf("open %T: %v", svc, err)
	}
	for _, f := range prepare {
		f(svc)
	}
	return svc, Run(t, fmt.Sprintf("%T", svc), svc)
}

// Running is a service run by Run.
type Running struct {
	name string
	svc  lifecycle.Service
	done chan error // Run's error, once it returned

	once     sync.Once
	err      error
	mu       sync.Mutex // guards tolerate
	tolerate bool
}

// Run runs an opened service until Stop, or until the test ends: the
// cleanup stops it and fails the test if Run failed, unless Tolerate was
// called.
func Run(t testing.TB, name string, svc lifecycle.Service) *Running {
	r := &Running{name: name, svc: svc, done: make(chan error, 1)}
	go func() { r.done <- svc.Run(context.Background()) }()
	t.Cleanup(func() {
		err := r.Stop()
		r.mu.Lock()
		tolerate := r.tolerate
		r.mu.Unlock()
		if err != nil && !tolerate {
			t.Errorf("%v", err)
		}
	})
	return r
}

// Tolerate spares the test Run's error at cleanup: for a service the test
// broke on purpose (killed its Redis, cut its connections).
func (r *Running) Tolerate() {
	r.mu.Lock()
	r.tolerate = true
	r.mu.Unlock()
}

// Stop closes the service, which stops its Run and waits for it, and
// returns Run's error. A Run that had not begun when Close came returns
// lifecycle.ErrClosed: the service was closed without running, which is a
// stop too. Later calls return the first's error.
func (r *Running) Stop() error {
	r.once.Do(func() {
		closed := make(chan struct{})
		go func() {
			r.svc.Close()
			close(closed)
		}()
		select {
		case <-closed:
			if err := <-r.done; err != nil && !errors.Is(err, lifecycle.ErrClosed) {
				r.err = fmt.Errorf("%s stopped with: %w", r.name, err)
			}
		case <-time.After(StopTimeout):
			var stacks strings.Builder
			pprof.Lookup("goroutine").WriteTo(&stacks, 1)
			r.err = fmt.Errorf("%s did not stop within %v; goroutines:\n%s", r.name, StopTimeout, stacks.String())
		}
	})
	return r.err
}
