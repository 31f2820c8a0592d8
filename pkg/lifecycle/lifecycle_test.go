package lifecycle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// fake is a service whose Run waits for its context and whose Close
// counts the frees.
type fake struct {
	runs  Runs
	freed atomic.Int32
	// running is closed once Run has its context.
	running chan struct{}
}

var _ Service = (*fake)(nil)

func (f *fake) Run(ctx context.Context) error {
	ctx, end, err := f.runs.Start(ctx)
	if err != nil {
		return err
	}
	defer end()
	close(f.running)
	<-ctx.Done()
	if f.freed.Load() != 0 {
		return errors.New("freed while running")
	}
	return nil
}

func (f *fake) Close() error {
	return f.runs.Close(func() error {
		f.freed.Add(1)
		return nil
	})
}

func TestCloseStopsRunThenFreesOnce(t *testing.T) {
	f := &fake{running: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- f.Run(context.Background()) }()
	<-f.running
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := f.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			// Every Close returns after the free, which came after Run.
			if f.freed.Load() != 1 {
				t.Errorf("freed %d times when Close returned, want 1", f.freed.Load())
			}
		})
	}
	wg.Wait()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestRunAfterClose(t *testing.T) {
	f := &fake{running: make(chan struct{})}
	f.Close()
	if err := f.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v, want ErrClosed", err)
	}
	if f.freed.Load() != 1 {
		t.Fatalf("freed %d times, want 1", f.freed.Load())
	}
}

func TestRunTwice(t *testing.T) {
	f := &fake{running: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.Run(ctx); err != nil {
		t.Fatalf("first Run: %v", err)
	}
	if err := f.Run(context.Background()); err == nil {
		t.Fatal("second Run: no error")
	}
	f.Close()
}
