//go:build linux

package wsread

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// epollFd is the poller's epoll fd number.
func epollFd(t *testing.T, p *poller) int {
	fd := -1
	if err := p.rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// epollClosed says whether the poller's epoll file is closed.
func epollClosed(p *poller) bool {
	return p.rc.Control(func(uintptr) {}) != nil
}

// TestCloseRacingRunEnd: connections closed here (ws.Close) while Run
// ends. Their end was queued for a worker; the workers left on the stop
// signal with the queue not empty, and Run's shutdown only ended the
// connections still in its table (a closed one is not): Closed never came.
func TestCloseRacingRunEnd(t *testing.T) {
	release := make(chan struct{})
	ts, stop := runServer(t, Config{Mode: ModeEpoll, Workers: 2}, func(r *recorder) {
		r.onMessage = func(*recorder, int, []byte) bool { <-release; return true }
	})
	// Both workers busy in a handler.
	for range 2 {
		c := dialRaw(t, ts.url, nil)
		ts.next(t)
		c.write(t, masked(opText, true, "hold"))
	}
	waitFor(t, "both workers in a handler", func() bool {
		n := 0
		for _, r := range ts.recs {
			n += len(r.messages())
		}
		return n == 2
	})
	// Idle connections closed here: their ends fill the workers' queue.
	var idle []*recorder
	for range 4 * 2 {
		dialRaw(t, ts.url, nil)
		r := ts.next(t)
		idle = append(idle, r)
		waitFor(t, "registration", func() bool { r.c.mu.Lock(); defer r.c.mu.Unlock(); return r.c.registered })
	}
	for _, r := range idle {
		r.c.WS().Close()
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	waitFor(t, "the stop signal", func() bool {
		select {
		case <-ts.s.p.stop:
			return true
		default:
			return false
		}
	})
	close(release)
	<-stopped
	for i, r := range idle {
		waitFor(t, "Closed of a connection closed while Run ended", func() bool { return len(r.closes()) > 0 })
		if cl := r.closes(); len(cl) != 1 || !errors.Is(cl[0], net.ErrClosed) {
			t.Fatalf("connection %d: Closed %v", i, cl)
		}
	}
}

// TestRunEndMidBatch: a worker is in a handler when Run ends. Run promises
// that every connection still being read is closed and gets
// Closed(net.ErrClosed); the worker re-armed on the closed epoll set
// instead and ended the connection with that error, socket left open.
func TestRunEndMidBatch(t *testing.T) {
	release := make(chan struct{})
	ts, stop := runServer(t, Config{Mode: ModeEpoll, Workers: 1}, func(r *recorder) {
		r.onMessage = func(*recorder, int, []byte) bool { <-release; return true }
	})
	c := dialRaw(t, ts.url, nil)
	rec := ts.next(t)
	c.write(t, masked(opText, true, "hold"))
	waitFor(t, "the handler", func() bool { return len(rec.messages()) == 1 })
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	waitFor(t, "the epoll set closed", func() bool { return epollClosed(ts.s.p) })
	close(release)
	<-stopped
	wantErr(t, rec.waitClosed(t), net.ErrClosed)
	// The server closed the socket: the client's reader ends.
	select {
	case _, ok := <-c.frames:
		if ok {
			t.Fatal("a frame, want the connection closed")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the socket was left open")
	}
}

// TestServeAfterRunEndsEpfdReused: Serve after Run ended, with the closed
// epoll set's fd number taken by another epoll set (another Server opened
// since). The stale number registered the connection in the other set:
// Closed never came.
func TestServeAfterRunEndsEpfdReused(t *testing.T) {
	var (
		held = make(chan *Conn, 1)
		s    *Server
	)
	s, err := New(Config{Mode: ModeEpoll})
	if err != nil {
		t.Fatal(err)
	}
	up := &websocket.Upgrader{ReadBufferSize: 128}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := s.Upgrade(up, w, r, nil)
		if err != nil {
			return
		}
		held <- c // served later
	}))
	defer hs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	dialRaw(t, "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
	c := <-held
	old := epollFd(t, s.p)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Open epoll sets until one gets the old number (fds are allocated
	// lowest first; the extra ones fill lower free numbers).
	var others []*Server
	defer func() {
		for _, o := range others {
			o.Close()
		}
	}()
	for len(others) < 1000 {
		o, err := New(Config{Mode: ModeEpoll})
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, o)
		if epollFd(t, o.p) >= old {
			break
		}
	}
	if got := epollFd(t, others[len(others)-1].p); got != old {
		t.Fatalf("fd %d was taken by something else (got %d)", old, got)
	}
	rec := &recorder{c: c}
	s.Serve(c, rec)
	rec.waitClosed(t)
	c.WS().Close()
}

// TestLingerEndsWhilePeerPongs: the handler sends a close, lingers and
// returns false; the peer keeps sending pongs, and the pong handler (as a
// gateway's does) pushes the read deadline out. The goroutine mode
// lingered through gorilla, whose pong handler moved the linger's
// deadline: the linger never ended.
func TestLingerEndsWhilePeerPongs(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts, _ := runServer(t, Config{Mode: mode, SweepInterval: 10 * time.Millisecond}, func(r *recorder) {
				ws := r.c.WS()
				ws.SetPongHandler(func(string) error { return ws.SetReadDeadline(time.Now().Add(time.Hour)) })
				r.onMessage = func(r *recorder, _ int, _ []byte) bool {
					ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(4000, ""), time.Now().Add(time.Second))
					r.c.Linger(100 * time.Millisecond)
					return false
				}
			})
			c := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			c.write(t, masked(opText, true, "quit"))
			c.expect(t, opClose)
			deadline := time.Now().Add(10 * time.Second)
			for len(rec.closes()) == 0 && time.Now().Before(deadline) {
				if _, err := c.nc.Write(masked(opPong, true, "")); err != nil {
					break // the server hung up: fine
				}
				time.Sleep(5 * time.Millisecond) // pace the pongs, not a wait
			}
			if err := rec.waitClosed(t); err != nil {
				t.Fatalf("Closed(%v), want nil", err)
			}
		})
	}
}

// TestPingWhileWriterBlocked: one worker. The application's writer is
// blocked writing to a peer that does not read (holding gorilla's write
// lock until its deadline), and that peer sends pings. gorilla's own ping
// handler answers inside ReadMessage, waiting up to a second per ping for
// the write lock: the worker was stuck there until the writer gave up, and
// another connection's message waited as long.
func TestPingWhileWriterBlocked(t *testing.T) {
	ts, _ := runServer(t, Config{Mode: ModeEpoll, Workers: 1}, nil)
	slow := idleClient(t, strings.TrimPrefix(ts.url, "ws://")) // never reads
	defer slow.Close()
	ws := ts.next(t).c.WS()
	writerDone := make(chan error, 1)
	go func() {
		// One frame far larger than the socket buffers: gorilla holds its
		// write lock for the whole write.
		ws.SetWriteDeadline(time.Now().Add(8 * time.Second))
		writerDone <- ws.WriteMessage(websocket.BinaryMessage, make([]byte, 64<<20))
	}()
	waitFor(t, "the writer holding the write lock", func() bool {
		// Fails (without harm) only when waiting for the lock timed out.
		return ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Millisecond)) != nil
	})
	var pings []byte
	for range 20 {
		pings = append(pings, masked(opPing, true, "p")...)
	}
	if _, err := slow.Write(pings); err != nil {
		t.Fatal(err)
	}
	quiet := dialRaw(t, ts.url, nil)
	rec := ts.next(t)
	quiet.write(t, masked(opText, true, "q"))
	got, gone := make(chan struct{}), make(chan struct{})
	defer close(gone)
	go func() {
		for len(rec.messages()) == 0 {
			select {
			case <-gone:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
		close(got)
	}()
	select {
	case <-got:
	case err := <-writerDone:
		t.Fatalf("the quiet connection's message waited for the blocked writer (it ended: %v)", err)
	}
}
