package wsread

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestDial: the client side; the server writes frames right after its 101
// response, in the same write, so gorilla's client reader would hold them.
func TestDial(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				nc, brw, err := w.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				defer nc.Close()
				resp := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
					acceptKey(r.Header.Get("Sec-Websocket-Key")) + "\r\n\r\n"
				out := slices.Concat([]byte(resp),
					frame(opText, true, false, []byte("one")),
					frame(opPing, true, false, []byte("p")),
					frame(opText, false, false, []byte("tw")), frame(opCont, true, false, []byte("o")))
				nc.Write(out)
				// the client's pong, then a late message
				f, err := readClientFrame(brw)
				if err != nil || f.op != opPong {
					return
				}
				nc.Write(frame(opBinary, true, false, []byte("three")))
				for { // until the client hangs up: it closes first
					if _, err := readClientFrame(brw); err != nil {
						return
					}
				}
			}))
			defer hs.Close()
			s, err := New(Config{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- s.Run(ctx) }()
			defer func() { cancel(); <-done }()
			c, _, err := s.Dial(ctx, &websocket.Dialer{ReadBufferSize: 128}, "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{c: c}
			s.Serve(c, rec)
			waitFor(t, "three messages", func() bool { return len(rec.messages()) == 3 })
			if got := rec.messages(); !slices.Equal(got, []string{"one", "two", "three"}) {
				t.Fatalf("got %q", got)
			}
			c.WS().WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(1000, ""), time.Now().Add(time.Second))
			c.WS().Close()
			wantErr(t, rec.waitClosed(t), net.ErrClosed)
		})
	}
}

// readClientFrame reads one masked frame (payload unmasked).
func readClientFrame(brw interface{ Read([]byte) (int, error) }) (rawFrame, error) {
	var h [6]byte
	if _, err := readFull(brw, h[:]); err != nil {
		return rawFrame{}, err
	}
	p := make([]byte, h[1]&0x7f)
	if _, err := readFull(brw, p); err != nil {
		return rawFrame{}, err
	}
	for i := range p {
		p[i] ^= h[2+i%4]
	}
	return rawFrame{op: h[0] & 0x0f, payload: p}, nil
}

func readFull(r interface{ Read([]byte) (int, error) }, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := r.Read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// idleClient opens a raw WebSocket connection and holds it, without a
// goroutine.
func idleClient(tb testing.TB, addr string) net.Conn {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	req := "GET / HTTP/1.1\r\nHost: " + addr + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	if _, err := nc.Write([]byte(req)); err != nil {
		tb.Fatal(err)
	}
	// 129 bytes of 101 response; read it whole so nothing is left.
	buf := make([]byte, 129)
	if _, err := readFull(nc, buf); err != nil {
		tb.Fatal(err)
	}
	return nc
}

type nopHandler struct{}

func (nopHandler) Message(int, []byte) bool { return true }
func (nopHandler) Closed(error)             {}

// idleServer serves idle connections in mode; served counts them.
func idleServer(tb testing.TB, mode Mode) (addr string, served func() int) {
	s, err := New(Config{Mode: mode})
	if err != nil {
		tb.Fatal(err)
	}
	var mu sync.Mutex
	count := 0
	up := &websocket.Upgrader{ReadBufferSize: 128, WriteBufferPool: &sync.Pool{}}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := s.Upgrade(up, w, r, nil)
		if err != nil {
			return
		}
		s.Serve(c, nopHandler{})
		mu.Lock()
		count++
		mu.Unlock()
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		<-done
		hs.Close()
	})
	return strings.TrimPrefix(hs.URL, "http://"), func() int { mu.Lock(); defer mu.Unlock(); return count }
}

func dialIdle(tb testing.TB, addr string, n int) []net.Conn {
	var cs []net.Conn
	for range n {
		cs = append(cs, idleClient(tb, addr))
	}
	tb.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	return cs
}

// TestIdleGoroutines: 2,000 idle connections in epoll mode leave the
// goroutine count where it was.
func TestIdleGoroutines(t *testing.T) {
	if !epollSupported {
		t.Skip("epoll mode only")
	}
	addr, served := idleServer(t, ModeEpoll)
	dialIdle(t, addr, 1)
	waitFor(t, "one connection", func() bool { return served() == 1 })
	before := runtime.NumGoroutine()
	const n = 2000
	dialIdle(t, addr, n)
	waitFor(t, "2000 connections", func() bool { return served() == n+1 })
	// The HTTP server's goroutine of each connection ends once Upgrade
	// returned; wait for the last few.
	var now int
	waitFor(t, "a goroutine count independent of the connections", func() bool {
		now = runtime.NumGoroutine()
		return now <= before+10
	})
	t.Logf("%d goroutines with 1 connection, %d with %d", before, now, n+1)
}

// BenchmarkIdleConn measures heap and stacks in use per idle connection
// (HeapInuse+StackInuse delta / connections, after GC). Both ends of each
// connection live in this process: B/tcp-pair is the same measure for
// plain TCP pairs, whose client half should be subtracted.
func BenchmarkIdleConn(b *testing.B) {
	const n = 2000
	b.Run("tcp-pair", func(b *testing.B) {
		for range min(b.N, 1) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			var held []net.Conn
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					held = append(held, c)
					mu.Unlock()
				}
			}()
			m0 := inUse()
			var cs []net.Conn
			for range n {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				cs = append(cs, c)
			}
			waitFor(b, "accepts", func() bool { mu.Lock(); defer mu.Unlock(); return len(held) == n })
			b.ReportMetric(float64(inUse()-m0)/n, "B/tcp-pair")
			ln.Close()
			for _, c := range cs {
				c.Close()
			}
			mu.Lock()
			for _, c := range held {
				c.Close()
			}
			mu.Unlock()
		}
	})
	for _, mode := range modes() {
		// Measured once, whatever b.N: each measure holds 2n descriptors
		// until its round ends, and rounds of several would pass the
		// open-file limit.
		var perConn, goroutines float64
		measured := false
		b.Run(string(mode), func(b *testing.B) {
			if !measured {
				addr, served := idleServer(b, mode)
				base := runtime.NumGoroutine()
				m0 := inUse()
				dialIdle(b, addr, n)
				waitFor(b, "connections", func() bool { return served() == n })
				if mode == ModeGoroutine {
					waitFor(b, "readers", func() bool { return runtime.NumGoroutine() >= base+n })
				}
				perConn, goroutines = float64(inUse()-m0)/n, float64(runtime.NumGoroutine()-base)
				measured = true
			}
			for range b.N {
			}
			b.ReportMetric(perConn, "B/conn")
			b.ReportMetric(goroutines, "goroutines")
		})
	}
}

func inUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse + ms.StackInuse)
}
