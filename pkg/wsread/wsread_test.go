package wsread

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// seqMsgs is what seq carries: a fragmented message with a ping and a pong
// between its fragments, a binary one, a ping, a 16-bit-length one, a pong,
// a last one.
var seqMsgs = []string{"hello", "bb", strings.Repeat("x", 200), "end"}

func seq() (all []byte, ends []int, pings int) {
	parts := []struct {
		f   []byte
		end bool // a message ends here
	}{
		{masked(opText, false, "he"), false},
		{masked(opPing, true, "1"), false},
		{masked(opCont, false, "l"), false},
		{masked(opPong, true, ""), false},
		{masked(opCont, true, "lo"), true},
		{masked(opBinary, true, "bb"), true},
		{masked(opPing, true, "2"), false},
		{masked(opText, true, strings.Repeat("x", 200)), true},
		{masked(opPong, true, "p"), false},
		{masked(opText, true, "end"), true},
	}
	for _, p := range parts {
		all = append(all, p.f...)
		if p.end {
			ends = append(ends, len(all))
		}
		if p.f[0]&0x0f == opPing {
			pings++
		}
	}
	return all, ends, pings
}

// TestSplitEveryByte writes seq in two writes, cut at every byte; the
// server reads the first part before the second is sent.
func TestSplitEveryByte(t *testing.T) {
	all, ends, pings := seq()
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode}, nil)
			for k := 1; k < len(all); k++ {
				c := dialRaw(t, ts.url, nil)
				rec := ts.next(t)
				base := ts.read.Load()
				c.write(t, all[:k])
				whole := 0
				for _, e := range ends {
					if e <= k {
						whole++
					}
				}
				if mode == ModeEpoll {
					waitFor(t, "the first part read", func() bool { return ts.read.Load() == base+int64(k) })
				}
				waitFor(t, "the whole messages of the first part", func() bool { return len(rec.messages()) == whole })
				c.write(t, all[k:])
				waitFor(t, "every message", func() bool { return len(rec.messages()) == len(seqMsgs) })
				if got := rec.messages(); !slices.Equal(got, seqMsgs) {
					t.Fatalf("cut at %d: got %q", k, got)
				}
				for range pings {
					c.expect(t, opPong)
				}
				c.nc.Close()
				if err := rec.waitClosed(t); err.Error() != errUnexpectedEOF().Error() {
					t.Fatalf("Closed(%v), want %v", err, errUnexpectedEOF())
				}
			}
		})
	}
}

// errUnexpectedEOF is what gorilla returns when the peer hangs up.
func errUnexpectedEOF() error {
	return &websocket.CloseError{Code: websocket.CloseAbnormalClosure, Text: io.ErrUnexpectedEOF.Error()}
}

func TestThreeFramesInOneWrite(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode}, nil)
			c := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			c.write(t, slices.Concat(masked(opText, true, "a"), masked(opBinary, true, "b"), masked(opText, true, "c")))
			waitFor(t, "3 messages", func() bool { return len(rec.messages()) == 3 })
			if got := rec.messages(); !slices.Equal(got, []string{"a", "b", "c"}) {
				t.Fatalf("got %q", got)
			}
			if rec.types[1] != websocket.BinaryMessage {
				t.Fatalf("types %v", rec.types)
			}
		})
	}
}

// TestMessagesOfMixedSizesInOneWrite: a long message, then shorter ones,
// then a long one again, in one batch. The epoll worker reads each into
// memory it reuses, so each must hold its own bytes and no more.
func TestMessagesOfMixedSizesInOneWrite(t *testing.T) {
	long, longer := strings.Repeat("x", 700), strings.Repeat("y", 1500)
	want := []string{long, "a", "", "bc", longer, "d"}
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode}, nil)
			c := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			var b []byte
			for _, m := range want {
				b = append(b, masked(opText, true, m)...)
			}
			c.write(t, b)
			waitFor(t, "6 messages", func() bool { return len(rec.messages()) == len(want) })
			if got := rec.messages(); !slices.Equal(got, want) {
				t.Fatalf("got %q", got)
			}
		})
	}
}

// TestControlOnly: 20 pings and 20 pongs, no data frame: every ping is
// answered, the pong handler runs for each pong, nothing is delivered and
// no goroutine waits for a data frame.
func TestControlOnly(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			var pongs atomic.Int64
			ts := startServer(t, Config{Mode: mode}, func(r *recorder) {
				r.c.WS().SetPongHandler(func(string) error { pongs.Add(1); return nil })
			})
			before := 0
			const conns = 10
			for i := range conns {
				if i == 1 {
					before = runtime.NumGoroutine() // the server is running now
				}
				c := dialRaw(t, ts.url, nil)
				ts.next(t)
				var b []byte
				for i := range 20 {
					b = append(b, masked(opPing, true, "p")...)
					b = append(b, masked(opPong, true, string(rune('a'+i)))...)
				}
				c.write(t, b)
				for range 20 {
					if p := c.expect(t, opPong); string(p) != "p" {
						t.Fatalf("pong %q", p)
					}
				}
			}
			waitFor(t, "every pong handled", func() bool { return pongs.Load() == 20*conns })
			for _, r := range ts.recs {
				if len(r.messages()) != 0 {
					t.Fatalf("delivered %q", r.messages())
				}
			}
			if mode == ModeEpoll {
				// The client side here has no goroutine per connection
				// either, only the raw clients' frame readers (one each).
				if n := runtime.NumGoroutine(); n > before+conns+2 {
					t.Fatalf("%d goroutines, %d before", n, before)
				}
			}
		})
	}
}

func TestClientClose(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode}, nil)
			c := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			c.write(t, slices.Concat(masked(opText, true, "x"), masked(opClose, true, "\x03\xe8bye")))
			if code := closeCode(c.expect(t, opClose)); code != websocket.CloseNormalClosure {
				t.Fatalf("close echoed with %d", code)
			}
			if got := closeErrCode(rec.waitClosed(t)); got != "1000" {
				t.Fatalf("Closed: %s", got)
			}
			if got := rec.messages(); !slices.Equal(got, []string{"x"}) {
				t.Fatalf("got %q", got)
			}
		})
	}
}

// TestServerClose: the handler writes a close frame, lingers and returns
// false; the client answers and hangs up; Closed(nil) once.
func TestServerClose(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode}, func(r *recorder) {
				r.onMessage = func(r *recorder, _ int, data []byte) bool {
					r.c.WS().WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(4000, "bye"), time.Now().Add(time.Second))
					r.c.Linger(10 * time.Second)
					return false
				}
			})
			c := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			c.write(t, masked(opText, true, "quit"))
			if code := closeCode(c.expect(t, opClose)); code != 4000 {
				t.Fatalf("close %d", code)
			}
			c.write(t, slices.Concat(masked(opText, true, "dropped"), masked(opClose, true, "\x0f\xa0")))
			c.nc.Close()
			if err := rec.waitClosed(t); err != nil {
				t.Fatalf("Closed(%v), want nil", err)
			}
			if got := rec.messages(); !slices.Equal(got, []string{"quit"}) {
				t.Fatalf("got %q", got)
			}
		})
	}
}

func TestReadLimit(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode, ReadLimit: 64}, nil)
			c := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			c.write(t, slices.Concat(masked(opText, true, "ok"), masked(opText, true, strings.Repeat("y", 100))))
			if code := closeCode(c.expect(t, opClose)); code != websocket.CloseMessageTooBig {
				t.Fatalf("close %d", code)
			}
			c.nc.Close()
			wantErr(t, rec.waitClosed(t), websocket.ErrReadLimit)
			if got := rec.messages(); !slices.Equal(got, []string{"ok"}) {
				t.Fatalf("got %q", got)
			}
		})
	}
}

// TestFloodDoesNotStarve: one worker, one connection sending as fast as it
// can; another connection's messages still come.
func TestFloodDoesNotStarve(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode, Workers: 1}, nil)
			flood := dialRaw(t, ts.url, nil)
			ts.next(t)
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				b := bytes.Repeat(masked(opBinary, true, strings.Repeat("f", 100)), 200)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := flood.nc.Write(b); err != nil {
						return
					}
				}
			}()
			defer func() { close(stop); flood.nc.Close(); <-done }()
			quiet := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			for i := range 20 {
				quiet.write(t, masked(opText, true, "q"))
				waitFor(t, "the quiet connection's message", func() bool { return len(rec.messages()) == i+1 })
			}
		})
	}
}

// TestFdReuse opens and closes connections quickly, so fds are reused;
// each message reaches its own connection's handler.
func TestFdReuse(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode}, nil)
			for i := range 300 {
				c := dialRaw(t, ts.url, nil)
				rec := ts.next(t)
				id := strings.Repeat("i", i%50) + string(rune('0'+i%10))
				c.write(t, masked(opText, true, id))
				waitFor(t, "the message", func() bool { return len(rec.messages()) == 1 })
				if got := rec.messages()[0]; got != id {
					t.Fatalf("connection %d got %q", i, got)
				}
				if i%2 == 0 {
					rec.c.WS().Close() // closed here
				} else {
					c.nc.Close() // closed there
				}
				rec.waitClosed(t)
				rec.c.WS().Close()
			}
			for i, r := range ts.recs {
				if n := len(r.messages()); n != 1 {
					t.Fatalf("connection %d got %d messages", i, n)
				}
			}
		})
	}
}

// TestCloseFromElsewhere: Close from another goroutine (twice) gives
// Closed(net.ErrClosed) once.
func TestCloseFromElsewhere(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode}, nil)
			c := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			c.write(t, masked(opText, true, "a"))
			waitFor(t, "a message", func() bool { return len(rec.messages()) == 1 })
			go rec.c.WS().Close()
			rec.c.WS().Close()
			wantErr(t, rec.waitClosed(t), net.ErrClosed)
			c.write(t, masked(opText, true, "late"))
			if _, ok := <-c.frames; ok {
				t.Fatal("the server sent a frame after Close")
			}
			if n := len(rec.closes()); n != 1 {
				t.Fatalf("Closed %d times", n)
			}
		})
	}
}

func TestReadDeadline(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode, SweepInterval: 10 * time.Millisecond}, func(r *recorder) {
				r.c.WS().SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			})
			dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			wantErr(t, rec.waitClosed(t), ErrIdle)
		})
	}
}

// TestFrameWithUpgradeRequest: a frame in the same write as the request.
// Plain gorilla v1.5.3 (goroutine mode) refuses it; the epoll mode reads it.
func TestFrameWithUpgradeRequest(t *testing.T) {
	if !epollSupported {
		t.Skip("epoll mode only")
	}
	ts := startServer(t, Config{Mode: ModeEpoll}, nil)
	dialRaw(t, ts.url, slices.Concat(masked(opText, true, "early"), masked(opPing, true, "")))
	rec := ts.next(t)
	waitFor(t, "the early message", func() bool { return len(rec.messages()) == 1 })
	if got := rec.messages()[0]; got != "early" {
		t.Fatalf("got %q", got)
	}
}

// TestManyRandom: connections × random messages (fragmented, control
// frames between fragments and messages) cut into random writes; every
// message back in order.
func TestManyRandom(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode, ReadLimit: 4096}, nil)
			const conns, msgs = 20, 200
			type client struct {
				c    *rawClient
				rec  *recorder
				want []string
				wire []byte
			}
			rng := rand.New(rand.NewPCG(1, 2))
			clients := make([]*client, conns)
			for i := range clients {
				cl := &client{c: dialRaw(t, ts.url, nil), rec: ts.next(t)}
				for m := range msgs {
					payload := []byte(strings.Repeat(string(rune('a'+m%26)), rng.IntN(600)))
					cl.want = append(cl.want, string(payload))
					op := byte(opText)
					for {
						n := min(len(payload), rng.IntN(300))
						fin := n == len(payload) && rng.IntN(3) > 0
						cl.wire = append(cl.wire, frame(op, fin, true, payload[:n])...)
						payload = payload[n:]
						if rng.IntN(4) == 0 {
							cl.wire = append(cl.wire, masked(byte(opPing+rng.IntN(2)), true, "c")...)
						}
						op = opCont
						if fin {
							break
						}
					}
				}
				clients[i] = cl
			}
			errs := make(chan error, conns)
			for _, cl := range clients {
				go func() {
					rng := rand.New(rand.NewPCG(uint64(len(cl.wire)), 3))
					w := cl.wire
					for len(w) > 0 {
						n := min(len(w), 1+rng.IntN(700))
						if _, err := cl.c.nc.Write(w[:n]); err != nil {
							errs <- err
							return
						}
						w = w[n:]
					}
					errs <- nil
				}()
			}
			for range conns {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for i, cl := range clients {
				waitFor(t, "every message", func() bool { return len(cl.rec.messages()) >= msgs })
				if got := cl.rec.messages(); !slices.Equal(got, cl.want) {
					t.Fatalf("connection %d: messages differ", i)
				}
			}
		})
	}
}
