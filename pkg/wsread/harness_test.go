package wsread

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// modes are the modes a test runs in on this platform.
func modes() []Mode {
	if epollSupported {
		return []Mode{ModeEpoll, ModeGoroutine}
	}
	return []Mode{ModeGoroutine}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !holdsWithin(20*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// holdsWithin polls cond until it holds (true) or d has passed (false),
// for a caller that must not stop the test: a goroutine of its own, or
// one that reports more than the timeout.
func holdsWithin(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// recorder is a Handler that keeps what it got.
type recorder struct {
	c      *Conn
	mu     sync.Mutex
	msgs   []string
	types  []int
	closed []error
	// onMessage, if set, decides what Message returns.
	onMessage func(r *recorder, typ int, data []byte) bool
}

func (r *recorder) Message(typ int, data []byte) bool {
	r.mu.Lock()
	r.msgs = append(r.msgs, string(data))
	r.types = append(r.types, typ)
	r.mu.Unlock()
	if r.onMessage != nil {
		return r.onMessage(r, typ, data)
	}
	return true
}

func (r *recorder) Closed(err error) {
	r.mu.Lock()
	r.closed = append(r.closed, err)
	r.mu.Unlock()
}

func (r *recorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

func (r *recorder) closes() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.closed...)
}

// waitClosed waits for Closed and checks it came once.
func (r *recorder) waitClosed(t testing.TB) error {
	t.Helper()
	waitFor(t, "Closed", func() bool { return len(r.closes()) > 0 })
	cl := r.closes()
	if len(cl) != 1 {
		t.Fatalf("Closed called %d times: %v", len(cl), cl)
	}
	return cl[0]
}

// testServer is a Server behind an httptest server; every connection gets
// a recorder, set up by setup (if any) before Serve.
type testServer struct {
	s     *Server
	url   string
	read  atomic.Int64 // bytes read from sockets (epoll)
	mu    sync.Mutex
	recs  []*recorder
	newCh chan *recorder
}

func startServer(t testing.TB, cfg Config, setup func(*recorder)) *testServer {
	t.Helper()
	ts, _ := runServer(t, cfg, setup)
	return ts
}

// runServer starts a Server with cfg behind an HTTP server, each
// connection served into a recorder that setup may prepare; stop cancels
// Run and waits for it to return (the test's cleanup does too).
func runServer(t testing.TB, cfg Config, setup func(*recorder)) (ts *testServer, stop func()) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts = &testServer{s: s, newCh: make(chan *recorder, 10000)}
	s.onRead = func(n int) { ts.read.Add(int64(n)) }
	up := &websocket.Upgrader{ReadBufferSize: 128, WriteBufferPool: &sync.Pool{}}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	ts.url = "ws" + strings.TrimPrefix(hs.URL, "http")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return")
			}
		})
	}
	t.Cleanup(func() { stop(); hs.Close() })
	return ts, stop
}

// dialMany dials n connections to ts, each with its recorder.
func dialMany(t testing.TB, ts *testServer, n int) ([]*rawClient, []*recorder) {
	t.Helper()
	clients := make([]*rawClient, n)
	recs := make([]*recorder, n)
	for i := range n {
		clients[i] = dialRaw(t, ts.url, nil)
		recs[i] = ts.next(t)
	}
	return clients, recs
}

// next is the recorder of the next connection the server accepted.
func (ts *testServer) next(t testing.TB) *recorder {
	t.Helper()
	select {
	case r := <-ts.newCh:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("no connection upgraded")
		return nil
	}
}

// rawClient speaks WebSocket by hand, so a test can cut frames anywhere.
type rawClient struct {
	nc     net.Conn
	frames chan rawFrame // what the server sent, read by a goroutine
}

type rawFrame struct {
	op      byte
	payload []byte
}

// dialRaw connects and sends the upgrade request followed by extra, in one
// write.
func dialRaw(t testing.TB, url string, extra []byte) *rawClient {
	t.Helper()
	addr := strings.TrimPrefix(url, "ws://")
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return upgradeRaw(t, nc, addr, extra)
}

// upgradeRaw sends the upgrade request on nc (followed by extra, in one
// write) and reads the response: nc may be any stream (TLS too).
func upgradeRaw(t testing.TB, nc net.Conn, addr string, extra []byte) *rawClient {
	t.Helper()
	req := "GET / HTTP/1.1\r\nHost: " + addr + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	if _, err := nc.Write(append([]byte(req), extra...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", resp.StatusCode)
	}
	c := &rawClient{nc: nc, frames: make(chan rawFrame, 1000)}
	go func() {
		defer close(c.frames)
		for {
			f, err := readServerFrame(br)
			if err != nil {
				return
			}
			c.frames <- f
		}
	}()
	t.Cleanup(func() { nc.Close() })
	return c
}

func readServerFrame(br *bufio.Reader) (rawFrame, error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return rawFrame{}, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return rawFrame{}, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return rawFrame{}, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(br, p); err != nil {
		return rawFrame{}, err
	}
	return rawFrame{op: h[0] & 0x0f, payload: p}, nil
}

func (c *rawClient) write(t testing.TB, p []byte) {
	t.Helper()
	if _, err := c.nc.Write(p); err != nil {
		t.Fatal(err)
	}
}

// expect reads the server's next frame and checks its opcode.
func (c *rawClient) expect(t testing.TB, op byte) []byte {
	t.Helper()
	select {
	case f, ok := <-c.frames:
		if !ok {
			t.Fatalf("connection ended, want opcode %d", op)
		}
		if f.op != op {
			t.Fatalf("got opcode %d (%q), want %d", f.op, f.payload, op)
		}
		return f.payload
	case <-time.After(20 * time.Second):
		t.Fatalf("no frame, want opcode %d", op)
		return nil
	}
}

// closeCode reads a close frame's code.
func closeCode(p []byte) int {
	if len(p) < 2 {
		return websocket.CloseNoStatusReceived
	}
	return int(binary.BigEndian.Uint16(p))
}

func masked(op byte, fin bool, p string) []byte { return frame(op, fin, true, []byte(p)) }

func wantErr(t testing.TB, got, want error) {
	t.Helper()
	if !errors.Is(got, want) {
		t.Fatalf("Closed(%v), want %v", got, want)
	}
}

func closeErrCode(err error) string {
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		return fmt.Sprint(ce.Code)
	}
	return fmt.Sprintf("not a close error: %v", err)
}
