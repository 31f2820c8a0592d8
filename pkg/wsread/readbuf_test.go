package wsread

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/websocket"
)

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
