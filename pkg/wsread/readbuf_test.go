package wsread

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gorilla/websocket"
)

// TestIdleHoldsNoReadBuffer: in epoll mode an upgraded connection's
// gorilla reads through the conn's own reader, which borrows a worker's
// buffer for each batch and holds the shared idle one between batches,
// messages longer than the buffer and control frames between fragments
// read as before.
func TestIdleHoldsNoReadBuffer(t *testing.T) {
	if !epollSupported {
		t.Skip("epoll mode only")
	}
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

// TestTLSInEpollMode: a connection without a file descriptor (TLS) is read
// by a goroutine through a read buffer of its own, in epoll mode too.
func TestTLSInEpollMode(t *testing.T) {
	if !epollSupported {
		t.Skip("epoll mode only")
	}
	s, err := New(Config{Mode: ModeEpoll})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	up := &websocket.Upgrader{ReadBufferSize: 128, WriteBufferPool: &sync.Pool{}}
	recs := make(chan *recorder, 1)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := s.Upgrade(up, w, r, nil)
		if err != nil {
			return
		}
		rec := &recorder{c: c}
		recs <- rec
		s.Serve(c, rec)
	}))
	hs.StartTLS()
	defer hs.Close()
	d := websocket.Dialer{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	ws, _, err := d.Dial("wss"+strings.TrimPrefix(hs.URL, "https"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	rec := <-recs
	if rec.c.fd >= 0 || rec.c.borrows {
		t.Fatalf("a TLS connection: fd %d, borrows %v; want a goroutine's, with a buffer of its own", rec.c.fd, rec.c.borrows)
	}
	want := []string{"a", strings.Repeat("z", 1000), "b"}
	for _, m := range want {
		if err := ws.WriteMessage(websocket.TextMessage, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every message", func() bool { return len(rec.messages()) == len(want) })
	if got := rec.messages(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestPassReadSize(t *testing.T) {
	for _, tc := range []struct{ in, want int }{{0, 4096}, {128, 257}, {256, 257}, {257, 257}, {1024, 1024}} {
		if got := passReadSize(tc.in); got != tc.want {
			t.Errorf("passReadSize(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
}
