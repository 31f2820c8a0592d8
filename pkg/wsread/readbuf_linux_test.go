//go:build linux

package wsread

import (
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// TestIdleHoldsNoReadBuffer: in epoll mode an upgraded connection's
// gorilla reads through the conn's own reader, which borrows a worker's
// buffer for each batch and holds the shared idle one between batches,
// messages longer than the buffer and control frames between fragments
// read as before.
func TestIdleHoldsNoReadBuffer(t *testing.T) {
	// gorilla reads a whole small batch into its buffer at once: if that
	// is the conn's reader, it still holds the rest during a message.
	var held atomic.Int64
	ts := startServer(t, Config{Mode: ModeEpoll}, func(r *recorder) {
		r.onMessage = func(r *recorder, _ int, _ []byte) bool {
			held.Store(max(held.Load(), int64(r.c.br.Buffered())))
			return true
		}
	})
	all, _, _ := seq()
	long := strings.Repeat("y", 3*batchReadSize+7)
	raw := dialRaw(t, ts.url, nil)
	rec := ts.next(t)
	raw.write(t, slices.Concat(all, masked(opText, true, long)))
	want := append(slices.Clone(seqMsgs), long)
	waitFor(t, "every message", func() bool { return len(rec.messages()) == len(want) })
	if got := rec.messages(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if held.Load() == 0 {
		t.Fatal("gorilla does not read through the conn's reader")
	}
	c := rec.c
	if !c.borrows {
		t.Fatal("an upgraded connection in batch mode does not borrow its read buffer")
	}
	idle := ts.s.p.idle.Size()
	waitFor(t, "the connection back in epoll, its buffer given back", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return !c.busy && c.br.Size() == idle
	})
	// And it reads on after its buffer went back.
	raw.write(t, masked(opText, true, "again"))
	waitFor(t, "the next message", func() bool { return len(rec.messages()) == len(want)+1 })
}
