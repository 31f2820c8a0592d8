//go:build linux

package wsread

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// gatedListener accepts a connection only when its gate lets one through,
// so that a test decides which fd numbers are free when the server's
// accept takes one.
type gatedListener struct {
	net.Listener
	gate chan struct{}
	done chan struct{}
	once sync.Once
}

func (l *gatedListener) Accept() (net.Conn, error) {
	select {
	case <-l.gate:
		return l.Listener.Accept()
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *gatedListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// startGated is startServer behind a gatedListener.
func startGated(t *testing.T, cfg Config, setup func(*recorder)) (*testServer, *gatedListener) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{s: s, newCh: make(chan *recorder, 100)}
	s.onRead = func(n int) { ts.read.Add(int64(n)) }
	up := &websocket.Upgrader{ReadBufferSize: 128, WriteBufferPool: &sync.Pool{}}
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := s.Upgrade(up, w, r, nil)
		if err != nil {
			return
		}
		rec := &recorder{c: c}
		if setup != nil {
			setup(rec)
		}
		ts.mu.Lock()
		ts.recs = append(ts.recs, rec)
		ts.mu.Unlock()
		ts.newCh <- rec
		s.Serve(c, rec)
	}))
	gl := &gatedListener{Listener: hs.Listener, gate: make(chan struct{}, 10), done: make(chan struct{})}
	hs.Listener = gl
	hs.Start()
	ts.url = "ws" + strings.TrimPrefix(hs.URL, "http")
	done := make(chan error, 1)
	go func() { done <- s.Run(t.Context()) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		hs.Close()
	})
	return ts, gl
}

// TestAttackCloseMidBatchFdReused: connection A's worker is in its handler
// with the rest of a batch (a message longer than the lent buffer) still
// to read, through the buffer it borrowed, when A is closed from elsewhere
// (a slow client cut off, a drain). Its fd number goes at once to the next
// connection, B, which is read by the other worker while A's batch is not
// over. B must get its own messages and pongs only, and keep getting them
// after A's turn ends; A must end once, with net.ErrClosed, without a
// byte of B's. If A's end removed B's table entry or epoll registration,
// B's user would go unread (a present user seen as silent, guides pushed
// to a connection nobody reads); if A's buffer went to B's batch while A
// still read it, one user's bytes would be in the other's stream.
func TestAttackCloseMidBatchFdReused(t *testing.T) {
	held, release := make(chan struct{}), make(chan struct{})
	ts, gl := startGated(t, Config{Mode: ModeEpoll, Workers: 2}, func(r *recorder) {
		r.onMessage = func(r *recorder, _ int, data []byte) bool {
			if string(data) == "hold" {
				held <- struct{}{}
				<-release
			}
			return true
		}
	})
	addr := strings.TrimPrefix(ts.url, "ws://")
	gl.gate <- struct{}{}
	a := dialRaw(t, ts.url, nil)
	recA := ts.next(t)
	longA := strings.Repeat("A", 3*batchReadSize)
	a.write(t, slices.Concat(masked(opText, true, "hold"), masked(opPing, true, "a"), masked(opText, true, longA)))
	<-held
	ca := recA.c
	if got := ca.br.Size(); got != batchReadSize {
		t.Fatalf("A's reader holds %d bytes mid-batch, want the lent %d", got, batchReadSize)
	}
	// B's socket (the client's end) takes its fd number before A's is
	// freed; the server's end is accepted after.
	nb, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ca.WS().Close()
	gl.gate <- struct{}{}
	b := upgradeRaw(t, nb, addr, nil)
	recB := ts.next(t)
	cb := recB.c
	if cb.fd != ca.fd {
		t.Fatalf("B got fd %d, A had %d: the test needs the number reused", cb.fd, ca.fd)
	}
	longB := strings.Repeat("B", 3*batchReadSize)
	b.write(t, slices.Concat(masked(opText, true, longB), masked(opPing, true, "b")))
	waitFor(t, "B's message, while A's batch is held", func() bool { return len(recB.messages()) == 1 })
	if got := b.expect(t, opPong); string(got) != "b" {
		t.Fatalf("B's pong %q", got)
	}
	close(release)
	wantErr(t, recA.waitClosed(t), net.ErrClosed)
	if got := recA.messages(); !slices.Equal(got, []string{"hold"}) {
		t.Fatalf("A got %d messages %.20q, want only hold", len(got), got)
	}
	ts.s.p.mu.Lock()
	entry := ts.s.p.conns[cb.fd]
	ts.s.p.mu.Unlock()
	if entry != cb {
		t.Fatal("B's table entry is gone after A's end")
	}
	// B is still read after A's turn ended.
	b.write(t, slices.Concat(masked(opText, true, "again"), masked(opPing, true, "b2")))
	waitFor(t, "B's next message", func() bool { return len(recB.messages()) == 2 })
	if got := b.expect(t, opPong); string(got) != "b2" {
		t.Fatalf("B's pong %q", got)
	}
	if got := recB.messages(); !slices.Equal(got, []string{longB, "again"}) {
		t.Fatalf("B got %.20q", got)
	}
	if cl := recB.closes(); len(cl) != 0 {
		t.Fatalf("B Closed(%v)", cl[0])
	}
	idle := ts.s.p.idle.Size()
	waitFor(t, "A's borrowed buffer given back", func() bool {
		ca.mu.Lock()
		defer ca.mu.Unlock()
		return !ca.busy && ca.br.Size() == idle
	})
}

// TestAttackLargeFds: connections on fd numbers in the thousands (a
// gateway with many open sockets) grow the table to them; they are read,
// swept and ended as low ones, an event for a number past the table is
// dropped, and once the high numbers are free, connections on low numbers
// are read on.
func TestAttackLargeFds(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 4200 {
		t.Skipf("needs 4200 open files (limit %d, %v)", lim.Cur, err)
	}
	ts := startServer(t, Config{Mode: ModeEpoll, SweepInterval: 10 * time.Millisecond}, nil)
	var filler []*os.File
	closeFiller := func() {
		for _, f := range filler {
			f.Close()
		}
		filler = nil
	}
	defer closeFiller()
	for range 4000 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		filler = append(filler, f)
	}
	long := strings.Repeat("h", 2*batchReadSize)
	high := dialRaw(t, ts.url, nil)
	recHigh := ts.next(t)
	if recHigh.c.fd < 4000 {
		t.Fatalf("fd %d, want one above 4000", recHigh.c.fd)
	}
	high.write(t, slices.Concat(masked(opText, true, long), masked(opPing, true, "h")))
	waitFor(t, "the high fd's message", func() bool { return len(recHigh.messages()) == 1 })
	high.expect(t, opPong)
	if got := ts.s.p.claim(int32(recHigh.c.fd)+1000, recHigh.c.gen); got != nil {
		t.Fatal("claimed a connection past the table")
	}
	closeFiller()
	low := dialRaw(t, ts.url, nil)
	recLow := ts.next(t)
	if recLow.c.fd > 1000 {
		t.Fatalf("fd %d, want a low one", recLow.c.fd)
	}
	low.write(t, masked(opText, true, "low"))
	waitFor(t, "the low fd's message", func() bool { return len(recLow.messages()) == 1 })
	// The sweep finds the high one past its deadline.
	recHigh.c.WS().SetReadDeadline(time.Now())
	if err := recHigh.waitClosed(t); !errors.Is(err, ErrIdle) {
		t.Fatalf("Closed(%v), want ErrIdle", err)
	}
	recHigh.c.WS().Close()
	low.write(t, masked(opText, true, "low2"))
	waitFor(t, "the low fd's next message", func() bool { return len(recLow.messages()) == 2 })
}
