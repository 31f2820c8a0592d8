package lifecycletest

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/stillthere/stillthere/pkg/lifecycle"
)

// fake is a service whose Run waits to be closed and returns runErr.
type fake struct {
	runs    lifecycle.Runs
	runErr  error
	freed   bool
	running chan struct{} // closed once Run has begun
}

var _ lifecycle.Service = (*fake)(nil)

func (f *fake) Run(ctx context.Context) error {
	ctx, end, err := f.runs.Start(ctx)
	if err != nil {
		return err
	}
	defer end()
	close(f.running)
	<-ctx.Done()
	return f.runErr
}

func (f *fake) Close() error {
	return f.runs.Close(func() error { f.freed = true; return nil })
}

func openFake(runErr error) Opener[string, *fake] {
	return func(_ context.Context, _ string, _ *slog.Logger) (*fake, error) {
		return &fake{runErr: runErr, running: make(chan struct{})}, nil
	}
}

func TestStartStop(t *testing.T) {
	var prepared bool
	f, run := Start(t, openFake(nil), "cfg", slog.Default(), func(*fake) { prepared = true })
	if !prepared {
		t.Error("prepare not called before Run")
	}
	if err := run.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !f.freed {
		t.Error("Stop did not free the service")
	}
	if err := run.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestStopReportsRunError: a Run that fails is the stop's error, a Run
// that had not begun (closed first) is not.
func TestStopReportsRunError(t *testing.T) {
	boom := errors.New("boom")
	f, run := Start(t, openFake(boom), "cfg", slog.Default())
	run.Tolerate() // the cleanup would report it again
	<-f.running    // else Close could come first, and Run return ErrClosed
	if err := run.Stop(); !errors.Is(err, boom) {
		t.Errorf("Stop: %v, want %v", err, boom)
	}

	closed := &fake{running: make(chan struct{})}
	closed.Close() // Run, when it comes, returns lifecycle.ErrClosed
	if err := Run(t, "closed", closed).Stop(); err != nil {
		t.Errorf("Stop of a service closed before it ran: %v", err)
	}
}
