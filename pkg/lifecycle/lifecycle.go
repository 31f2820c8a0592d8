// Package lifecycle is the shape the three services share: Open does all
// that can fail at start, Run(ctx) runs until ctx is done or Close is
// called, and Close stops a Run under way, waits for it, and frees what
// Open took. A failed Open frees what it took through Close, too, so that
// a failed start and a stopped service clean up the same way.
package lifecycle

import (
	"context"
	"errors"
	"sync"
)

// Service is an opened service.
type Service interface {
	// Run serves until ctx is done or Close is called, then stops
	// gracefully (drains, commits, leaves) and returns. It returns only
	// after every goroutine it started has exited.
	Run(ctx context.Context) error
	// Close stops Run if it runs and waits for it, then frees everything
	// Open took. It may be called more than once, and concurrently; every
	// call returns once the first has finished.
	Close() error
}

// ErrClosed is Run's error once Close was called.
var ErrClosed = errors.New("service closed")

// errRunTwice is Run's error when it was called before.
var errRunTwice = errors.New("service already ran: open another")

// Runs ties a service's Run to its Close: Close cancels the Run under way
// and waits for it before it frees anything, so that nothing Run uses is
// freed under it. The zero value is ready; a service holds one.
type Runs struct {
	mu     sync.Mutex // guards closed, ran, stop and done
	closed bool
	ran    bool
	stop   context.CancelFunc
	done   chan struct{} // closed when Run returns

	once sync.Once
	err  error
}

// Start begins a Run. It returns Run's context, which Close cancels, and
// end, which Run calls (deferred) when it returns. A Run after Close, or a
// second Run, gets an error and must return it at once.
func (r *Runs) Start(ctx context.Context) (_ context.Context, end func(), _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return nil, nil, ErrClosed
	case r.ran:
		return nil, nil, errRunTwice
	}
	r.ran = true
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	r.stop, r.done = cancel, done
	return ctx, func() {
		cancel()
		close(done)
	}, nil
}

// Ran reports whether Start was called, by a Run under way or over.
func (r *Runs) Ran() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ran
}

// Close stops the Run under way, if any, waits for it to return, and then
// calls free, once. Later calls wait for the first and return its error.
func (r *Runs) Close(free func() error) error {
	r.once.Do(func() {
		r.mu.Lock()
		r.closed = true
		stop, done := r.stop, r.done
		r.mu.Unlock()
		if stop != nil {
			stop()
			<-done
		}
		r.err = free()
	})
	return r.err
}
