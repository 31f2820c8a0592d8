package wsread

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// Attacks on the batch reader since gorilla reads through a 512-byte
// buffer lent per batch (batchReadSize): messages and frames longer than
// it, cut anywhere, with control frames in between; several connections'
// batches through the same pooled buffers; writes while a batch reads.
// A ping lost or mangled here leaves a present user looking silent (a
// wrong "are you still there?" guide); a message of one user delivered
// on another's connection is worse.

// longSeq is a stream of frames made to cross the lent buffer's size: a
// message of 520 bytes in two fragments with a ping and a pong between
// them, a binary one of 513 bytes (just over the buffer) followed at once
// by a ping, one of 512 (exactly the buffer), an empty one, and a ping at
// the end (after the last message: the batch needs a terminator).
func longSeq() (all []byte, msgs []string, ends []int, pings []string) {
	parts := []struct {
		f   []byte
		msg string // a message ends here
	}{
		{masked(opText, false, strings.Repeat("a", 260)), ""},
		{masked(opPing, true, "p1"), ""},
		{masked(opCont, false, strings.Repeat("b", 130)), ""},
		{masked(opPong, true, "q"), ""},
		{masked(opCont, true, strings.Repeat("c", 130)), strings.Repeat("a", 260) + strings.Repeat("b", 130) + strings.Repeat("c", 130)},
		{frame(opBinary, true, true, bytes.Repeat([]byte{'d'}, 513)), strings.Repeat("d", 513)},
		{masked(opPing, true, "p2"), ""},
		{masked(opText, true, strings.Repeat("e", batchReadSize)), strings.Repeat("e", batchReadSize)},
		{masked(opText, true, ""), "\x00"}, // an empty message, marked
		{masked(opPing, true, strings.Repeat("p", 125)), ""},
	}
	for _, p := range parts {
		all = append(all, p.f...)
		if p.msg != "" {
			m := p.msg
			if m == "\x00" {
				m = ""
			}
			msgs = append(msgs, m)
			ends = append(ends, len(all))
		}
		if p.f[0]&0x0f == opPing {
			pings = append(pings, string(unmask(p.f)))
		}
	}
	return all, msgs, ends, pings
}

// unmask is the payload of a short masked frame built by masked.
func unmask(f []byte) []byte {
	n := int(f[1] & 0x7f)
	key, p := f[2:6], slices.Clone(f[6:6+n])
	for i := range p {
		p[i] ^= key[i%4]
	}
	return p
}

// waitQuick is waitFor polling faster: for tests that wait thousands of
// times on loopback.
func waitQuick(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// sendInCuts writes all on c cut at the given offsets, and waits, before
// each next piece, until the server read the bytes so far (epoll mode:
// each piece is a batch of its own) and delivered the whole messages in
// them. It then checks the messages and the pongs. rec has got base
// messages before.
func sendInCuts(t *testing.T, mode Mode, ts *testServer, c *rawClient, rec *recorder, cuts []int) {
	t.Helper()
	all, msgs, ends, pings := longSeq()
	base := len(rec.messages())
	read := ts.read.Load()
	prev := 0
	for _, k := range append(slices.Clone(cuts), len(all)) {
		c.write(t, all[prev:k])
		prev = k
		whole := 0
		for _, e := range ends {
			if e <= k {
				whole++
			}
		}
		if mode == ModeEpoll {
			want := read + int64(k)
			waitQuick(t, "the piece read", func() bool { return ts.read.Load() == want })
		}
		waitQuick(t, "the whole messages so far", func() bool { return len(rec.messages()) >= base+whole })
	}
	if got := rec.messages()[base:]; !slices.Equal(got, msgs) {
		t.Fatalf("cut at %v: got %d messages %.40q, want %d", cuts, len(got), got, len(msgs))
	}
	for _, p := range pings {
		if got := c.expect(t, opPong); string(got) != p {
			t.Fatalf("cut at %v: pong %q, want %q", cuts, got, p)
		}
	}
	if cl := rec.closes(); len(cl) != 0 {
		t.Fatalf("cut at %v: Closed(%v)", cuts, cl[0])
	}
}

// TestAttackLongSplitEveryByte: longSeq in two writes, cut at every byte
// (epoll mode), each part read before the next is sent, over one
// connection; then in three writes cut at random. A frame or a message whose bytes span two
// batches, longer than the lent buffer, must come out whole and in order,
// and every ping be answered with its own payload.
func TestAttackLongSplitEveryByte(t *testing.T) {
	all, _, _, _ := longSeq()
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode, ReadLimit: 4096}, nil)
			c := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			// Every byte in the epoll mode, whose reader changed; every
			// 5th in the goroutine mode, to bound the time.
			step := 1
			if mode != ModeEpoll {
				step = 5
			}
			for k := 1; k < len(all); k += step {
				sendInCuts(t, mode, ts, c, rec, []int{k})
			}
			rng := rand.New(rand.NewPCG(7, 11))
			for range 100 {
				a, b := 1+rng.IntN(len(all)-1), 1+rng.IntN(len(all)-1)
				if a == b {
					continue
				}
				sendInCuts(t, mode, ts, c, rec, []int{min(a, b), max(a, b)})
			}
		})
	}
}

// TestAttackLongSplitEveryByteTLS: the same over TLS, which the epoll mode
// reads with a goroutine and a reader of its own (257 bytes, less than the
// long frames).
func TestAttackLongSplitEveryByteTLS(t *testing.T) {
	all, _, _, _ := longSeq()
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			s, err := New(Config{Mode: mode, ReadLimit: 4096})
			if err != nil {
				t.Fatal(err)
			}
			ts := &testServer{s: s, newCh: make(chan *recorder, 1)}
			up := &websocket.Upgrader{ReadBufferSize: 128, WriteBufferPool: &sync.Pool{}}
			hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, err := s.Upgrade(up, w, r, nil)
				if err != nil {
					return
				}
				rec := &recorder{c: c}
				ts.newCh <- rec
				s.Serve(c, rec)
			}))
			hs.StartTLS()
			defer hs.Close()
			done := make(chan error, 1)
			go func() { done <- s.Run(t.Context()) }()
			defer func() { s.Close(); <-done }()
			addr := strings.TrimPrefix(hs.URL, "https://")
			nc, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
			if err != nil {
				t.Fatal(err)
			}
			c := upgradeRaw(t, nc, addr, nil)
			rec := ts.next(t)
			if rec.c.fd >= 0 {
				t.Fatal("a TLS connection with a file descriptor")
			}
			// No socket counter here: the goroutine reads as bytes come.
			// Every 5th byte, to bound the time (TLS keeps the reader it
			// had).
			for k := 1; k < len(all); k += 5 {
				sendInCuts(t, ModeGoroutine, ts, c, rec, []int{k})
			}
		})
	}
}

// TestAttackCrossTalk: connections sharing two workers (and so the pooled
// buffers) send messages of their own byte, of 0 to 1500 bytes, in
// fragments with control frames between them, written in random pieces
// at once. A buffer lent to one connection's gorilla and still referenced
// when another's batch reuses it would put one user's bytes in another's
// stream: every message must be of its connection's byte alone, in order.
func TestAttackCrossTalk(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode, Workers: 2, ReadLimit: 2048}, nil)
			const conns, msgs = 24, 60
			type client struct {
				c    *rawClient
				rec  *recorder
				want []string
				wire []byte
			}
			rng := rand.New(rand.NewPCG(3, 5))
			clients := make([]*client, conns)
			for i := range clients {
				cl := &client{c: dialRaw(t, ts.url, nil), rec: ts.next(t)}
				own := byte('A' + i)
				for range msgs {
					payload := bytes.Repeat([]byte{own}, rng.IntN(1500))
					cl.want = append(cl.want, string(payload))
					op := byte(opText)
					for {
						n := min(len(payload), rng.IntN(700))
						fin := n == len(payload) && rng.IntN(3) > 0
						cl.wire = append(cl.wire, frame(op, fin, true, payload[:n])...)
						payload = payload[n:]
						if rng.IntN(3) == 0 {
							cl.wire = append(cl.wire, frame(byte(opPing+rng.IntN(2)), true, true, bytes.Repeat([]byte{own}, rng.IntN(126)))...)
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
			for i, cl := range clients {
				go func() {
					rng := rand.New(rand.NewPCG(uint64(i), 9))
					for w := cl.wire; len(w) > 0; {
						n := min(len(w), 1+rng.IntN(1100))
						if _, err := cl.c.nc.Write(w[:n]); err != nil {
							errs <- err
							return
						}
						w = w[n:]
					}
					errs <- nil
				}()
				go func() { // the pongs, of the connection's byte too
					own := byte('A' + i)
					for f := range cl.c.frames {
						if f.op == opPong && bytes.ContainsFunc(f.payload, func(r rune) bool { return r != rune(own) }) {
							errs <- fmt.Errorf("connection %d: pong %q", i, f.payload)
						}
					}
				}()
			}
			for range conns {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for i, cl := range clients {
				waitFor(t, "every message", func() bool { return len(cl.rec.messages()) >= msgs })
				got := cl.rec.messages()
				for j := range got {
					if got[j] != cl.want[j] {
						t.Fatalf("connection %d, message %d: %d bytes %.30q..., want %d of %q", i, j, len(got[j]), got[j], len(cl.want[j]), string(rune('A'+i)))
					}
				}
				if len(got) != msgs {
					t.Fatalf("connection %d: %d messages", i, len(got))
				}
			}
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
		})
	}
}

// TestAttackDataThenCloseInOneRead: a large message, a ping right after
// it, a small message and the client's close, in one write (one read);
// then the same cut one byte before the close frame and at its boundary.
// Each message is delivered, the ping answered, the close echoed and
// Closed given the client's 1000: a user who leaves with a last message
// must not have it lost, nor be seen as dropped (1006).
func TestAttackDataThenCloseInOneRead(t *testing.T) {
	large := strings.Repeat("L", 3*batchReadSize+1)
	data := slices.Concat(masked(opText, true, large), masked(opPing, true, "hi"), masked(opText, true, "last"))
	cl := masked(opClose, true, "\x03\xe8bye")
	all := slices.Concat(data, cl)
	for _, mode := range modes() {
		for _, cut := range []int{len(all), len(data), len(data) - 1, len(data) + 1} {
			t.Run(fmt.Sprintf("%s/cut%d", mode, cut), func(t *testing.T) {
				ts := startServer(t, Config{Mode: mode}, nil)
				c := dialRaw(t, ts.url, nil)
				rec := ts.next(t)
				c.write(t, all[:cut])
				if cut < len(all) {
					if mode == ModeEpoll {
						waitFor(t, "the first part read", func() bool { return ts.read.Load() == int64(cut) })
					}
					c.write(t, all[cut:])
				}
				// In epoll mode pongs go out from a goroutine of their
				// own and the close echo from the worker: a pong due when
				// the close comes in the same batch may be overtaken by
				// the echo, and is then not sent (nothing goes after a
				// close). The goroutine mode answers in order.
				if f := <-c.frames; f.op == opPong {
					if string(f.payload) != "hi" {
						t.Fatalf("pong %q", f.payload)
					}
					if code := closeCode(c.expect(t, opClose)); code != websocket.CloseNormalClosure {
						t.Fatalf("close echoed with %d", code)
					}
				} else if f.op != opClose || closeCode(f.payload) != websocket.CloseNormalClosure || mode != ModeEpoll {
					t.Fatalf("opcode %d (%q), want a pong then the close echoed", f.op, f.payload)
				}
				if got := closeErrCode(rec.waitClosed(t)); got != "1000" {
					t.Fatalf("Closed: %s", got)
				}
				if got := rec.messages(); !slices.Equal(got, []string{large, "last"}) {
					t.Fatalf("got %d messages %.20q", len(got), got)
				}
			})
		}
	}
}

// TestAttackReadLimitLong: a read limit above the lent buffer. A message
// of exactly the limit, in fragments with a ping between them, is
// delivered; one byte more gets 1009 and ErrReadLimit, the messages before
// it delivered. A user's frame at the limit must not cut them off.
func TestAttackReadLimitLong(t *testing.T) {
	const limit = 3*batchReadSize + 5
	atLimit := strings.Repeat("m", limit)
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode, ReadLimit: limit}, nil)
			c := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			ok := slices.Concat(
				masked(opText, false, atLimit[:700]), masked(opPing, true, "x"),
				masked(opCont, false, atLimit[700:1400]), masked(opCont, true, atLimit[1400:]),
				masked(opText, true, atLimit))
			c.write(t, ok)
			waitFor(t, "the messages at the limit", func() bool { return len(rec.messages()) == 2 })
			c.expect(t, opPong)
			c.write(t, slices.Concat(masked(opText, false, atLimit), masked(opCont, true, "!")))
			if code := closeCode(c.expect(t, opClose)); code != websocket.CloseMessageTooBig {
				t.Fatalf("close %d", code)
			}
			c.nc.Close()
			wantErr(t, rec.waitClosed(t), websocket.ErrReadLimit)
			if got := rec.messages(); !slices.Equal(got, []string{atLimit, atLimit}) {
				t.Fatalf("got %d messages", len(got))
			}
		})
	}
}

// TestAttackPushWhileReading: the server writes messages (pushes) from
// another goroutine while the client sends messages longer than the lent
// buffer with pings between them. Every push reaches the client, every
// ping gets its pong, every message is delivered, and the connection
// stays up: a guide pushed while the user's pings are being read must not
// be lost, nor the pings.
func TestAttackPushWhileReading(t *testing.T) {
	const n = 300
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			ts := startServer(t, Config{Mode: mode, ReadLimit: 4096}, nil)
			c := dialRaw(t, ts.url, nil)
			rec := ts.next(t)
			ws := rec.c.WS()
			pushed := make(chan error, 1)
			go func() {
				for i := range n {
					ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
					if err := ws.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, "guide %d %s", i, strings.Repeat("g", i))); err != nil {
						pushed <- err
						return
					}
				}
				pushed <- nil
			}()
			sent := make(chan error, 1)
			go func() {
				for i := range n {
					msg := fmt.Sprintf("msg %d %s", i, strings.Repeat("u", 600))
					if _, err := c.nc.Write(slices.Concat(masked(opText, true, msg), masked(opPing, true, fmt.Sprint(i)))); err != nil {
						sent <- err
						return
					}
				}
				sent <- nil
			}()
			guides, pongs, lastPong := 0, 0, -1
			for guides < n || pongs < n {
				select {
				case f, ok := <-c.frames:
					if !ok {
						t.Fatalf("connection ended after %d guides, %d pongs", guides, pongs)
					}
					switch f.op {
					case opText:
						if want := fmt.Sprintf("guide %d %s", guides, strings.Repeat("g", guides)); string(f.payload) != want {
							t.Fatalf("guide %d: %.30q", guides, f.payload)
						}
						guides++
					case opPong:
						// Pongs may be skipped (only the latest ping
						// must be answered), never reordered or mangled.
						var i int
						if _, err := fmt.Sscan(string(f.payload), &i); err != nil || i < lastPong {
							t.Fatalf("pong %q after %d", f.payload, lastPong)
						}
						lastPong = i
						if i == n-1 {
							pongs = n
						}
					default:
						t.Fatalf("opcode %d (%q)", f.op, f.payload)
					}
				case <-time.After(20 * time.Second):
					t.Fatalf("stuck after %d guides, %d pongs", guides, pongs)
				}
			}
			if err := <-pushed; err != nil {
				t.Fatal(err)
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			waitFor(t, "every message", func() bool { return len(rec.messages()) == n })
			for i, m := range rec.messages() {
				if want := fmt.Sprintf("msg %d %s", i, strings.Repeat("u", 600)); m != want {
					t.Fatalf("message %d: %.30q", i, m)
				}
			}
			if cl := rec.closes(); len(cl) != 0 {
				t.Fatalf("Closed(%v)", cl[0])
			}
		})
	}
}
