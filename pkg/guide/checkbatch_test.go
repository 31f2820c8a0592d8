package guide

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// fakeChecks answers checks from the uid: "live-..." is live, "fail-..."
// fails; it records each batch, and holds each until release yields.
type fakeChecks struct {
	mu      sync.Mutex
	batches [][]string
	release chan struct{}
}

func (f *fakeChecks) check(ctx context.Context, uids []string) ([]session.Check, []error) {
	f.mu.Lock()
	f.batches = append(f.batches, slices.Clone(uids))
	f.mu.Unlock()
	select {
	case <-f.release:
	case <-ctx.Done():
	}
	got, errs := make([]session.Check, len(uids)), make([]error, len(uids))
	for i, uid := range uids {
		switch {
		case ctx.Err() != nil:
			errs[i] = ctx.Err()
		case len(uid) > 5 && uid[:5] == "fail-":
			errs[i] = errors.New("refused: " + uid)
		default:
			got[i] = session.Check{Live: len(uid) > 5 && uid[:5] == "live-", Now: time.UnixMilli(int64(i + 1))}
		}
	}
	return got, errs
}

// TestCheckBatcher: checks asked for while a batch is out go together as
// the next one, each answered its own; a lone check goes at once; a batch
// never exceeds the bound; an error is its uid's alone.
func TestCheckBatcher(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeChecks{release: make(chan struct{})}
		b := newCheckBatcher(f.check, time.Minute, 4)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); b.run(ctx) }()

		type answer struct {
			uid  string
			live bool
			err  error
		}
		answers := make(chan answer, 16)
		ask := func(uid string) {
			go func() {
				c, err := b.check(t.Context(), uid)
				answers <- answer{uid, c.live, err}
			}()
		}
		// A lone check goes at once, alone.
		ask("live-0")
		synctest.Wait()
		// While it is out, six more queue.
		for i := range 6 {
			prefix := []string{"gone-", "live-", "fail-"}[i%3]
			ask(fmt.Sprintf("%s%d", prefix, i+1))
		}
		synctest.Wait()
		for range 3 { // the first batch, then the next two
			f.release <- struct{}{}
			synctest.Wait()
		}
		got := map[string]answer{}
		for range 7 {
			a := <-answers
			got[a.uid] = a
		}
		for uid, a := range got {
			wantLive, wantErr := uid[:5] == "live-", uid[:5] == "fail-"
			if a.live != wantLive || (a.err != nil) != wantErr {
				t.Errorf("check %s: live %v, err %v; want live %v, an error %v", uid, a.live, a.err, wantLive, wantErr)
			}
		}
		f.mu.Lock()
		sizes := []int{}
		for _, batch := range f.batches {
			sizes = append(sizes, len(batch))
		}
		f.mu.Unlock()
		if !slices.Equal(sizes, []int{1, 4, 2}) {
			t.Errorf("batches of %v, want [1 4 2]: the lone one alone, the six queued meanwhile in batches of at most 4", sizes)
		}
		cancel()
		<-done
	})
}

// TestCheckBatcherCallerGivesUp: a check whose context ends returns its
// error at once, and the batcher still answers the others.
func TestCheckBatcherCallerGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeChecks{release: make(chan struct{})}
		b := newCheckBatcher(f.check, time.Minute, 4)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); b.run(ctx) }()

		short, giveUp := context.WithTimeout(t.Context(), time.Second)
		defer giveUp()
		errc := make(chan error, 1)
		go func() { _, err := b.check(short, "gone-1"); errc <- err }()
		if err := <-errc; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("check past its deadline: %v, want DeadlineExceeded", err)
		}
		f.release <- struct{}{} // the abandoned batch ends; its reply is dropped
		livec := make(chan bool, 1)
		go func() { c, _ := b.check(t.Context(), "live-2"); livec <- c.live }()
		synctest.Wait()
		f.release <- struct{}{}
		if !<-livec {
			t.Error("the check after an abandoned one was not answered live")
		}
		cancel()
		<-done
	})
}
