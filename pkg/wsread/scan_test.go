package wsread

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/gorilla/websocket"
)

func TestScan(t *testing.T) {
	m := func(op byte, fin bool, p string) []byte { return frame(op, fin, true, []byte(p)) }
	cat := func(fs ...[]byte) []byte { return slices.Concat(fs...) }
	text := m(opText, true, "hello")
	ping := m(opPing, true, "p")
	pong := m(opPong, true, "")
	frag1, frag2 := m(opText, false, "he"), m(opCont, true, "llo")
	closeF := m(opClose, true, "\x03\xe8")
	big := m(opBinary, true, string(make([]byte, 300)))
	tests := []struct {
		name string
		in   []byte
		opts scanOpts
		want batch
	}{
		{"empty", nil, scanOpts{server: true}, batch{}},
		{"one byte", text[:1], scanOpts{server: true}, batch{}},
		{"whole text", text, scanOpts{server: true}, batch{n: len(text), msgs: 1}},
		{"text cut in payload", text[:len(text)-1], scanOpts{server: true}, batch{}},
		{"three frames", cat(text, text, text), scanOpts{server: true}, batch{n: 3 * len(text), msgs: 3}},
		{"control only", cat(ping, pong), scanOpts{server: true}, batch{n: len(ping) + len(pong), term: true}},
		{"message then control", cat(text, ping), scanOpts{server: true}, batch{n: len(text) + len(ping), msgs: 1, term: true}},
		{"control then message", cat(ping, text), scanOpts{server: true}, batch{n: len(ping) + len(text), msgs: 1}},
		{"fragments with ping between", cat(frag1, ping, frag2), scanOpts{server: true}, batch{n: len(frag1) + len(ping) + len(frag2), msgs: 1}},
		{"incomplete fragmented message holds its ping", cat(text, frag1, ping), scanOpts{server: true}, batch{n: len(text), msgs: 1}},
		{"close ends the batch", cat(text, closeF, text), scanOpts{server: true}, batch{n: len(text) + len(closeF), msgs: 1, stop: stopClose}},
		{"unmasked from a client", cat(text, frame(opText, true, false, nil)), scanOpts{server: true}, batch{n: len(text) + 2, msgs: 1, stop: stopBad}},
		{"masked from a server", text, scanOpts{}, batch{n: 2, stop: stopBad}},
		{"rsv2", []byte{finBit | 0x20 | opText, maskBit}, scanOpts{server: true}, batch{n: 2, stop: stopBad}},
		{"rsv1 without compression", []byte{finBit | rsv1Bit | opText, maskBit}, scanOpts{server: true}, batch{n: 2, stop: stopBad}},
		{"rsv1 with compression", frame(finBit|rsv1Bit|opText, false, true, nil), scanOpts{server: true, rsv1: true}, batch{n: 6, msgs: 1}},
		{"bad opcode", []byte{finBit | 3, maskBit}, scanOpts{server: true}, batch{n: 2, stop: stopBad}},
		{"fragmented ping", m(opPing, false, ""), scanOpts{server: true}, batch{n: 2, stop: stopBad}},
		{"long ping", []byte{finBit | opPing, maskBit | 126}, scanOpts{server: true}, batch{n: 2, stop: stopBad}},
		{"continuation first", m(opCont, true, "x"), scanOpts{server: true}, batch{n: 2, stop: stopBad}},
		{"text inside a message", cat(frag1, text), scanOpts{server: true}, batch{n: len(frag1) + 2, stop: stopBad}},
		{"over the limit", cat(text, big), scanOpts{server: true, limit: 100}, batch{n: len(text) + 8, msgs: 1, stop: stopTooBig}},
		{"over the limit, header cut", big[:5], scanOpts{server: true, limit: 100}, batch{}},
		{"fragments over the limit", cat(frag1, frag2), scanOpts{server: true, limit: 4}, batch{n: len(frag1) + 6, stop: stopTooBig}},
		{"64-bit length with the top bit", []byte{finBit | opBinary, maskBit | 127, 0x80, 0, 0, 0, 0, 0, 0, 0}, scanOpts{server: true}, batch{n: 10, stop: stopTooBig}},
		{"16-bit length", big, scanOpts{server: true, limit: 1000}, batch{n: len(big), msgs: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := scan(tt.in, tt.opts); got != tt.want {
				t.Fatalf("scan = %+v, want %+v", got, tt.want)
			}
			checkAgainstGorilla(t, tt.in, tt.opts)
		})
	}
}

// checkAgainstGorilla is the scan's reference: gorilla itself.
//  1. Fed the prefix and the terminator, gorilla returns exactly the
//     batch's messages (and its error, or the empty terminator message),
//     and never asks for a byte past them.
//  2. Fed all of in, gorilla returns the same messages and then either
//     the same kind of error or asks for more: the scan left no whole
//     message out.
func checkAgainstGorilla(t *testing.T, in []byte, o scanOpts) {
	t.Helper()
	if o.rsv1 {
		return // the reference conns do not negotiate compression
	}
	b := scan(in, o)
	if b.n < 0 || b.n > len(in) {
		t.Fatalf("prefix %d outside 0..%d", b.n, len(in))
	}
	ws, mc, err := memGorilla(o.server, o.limit)
	if err != nil {
		t.Fatal(err)
	}
	mc.in = slices.Clone(in[:b.n])
	if b.term {
		if o.server {
			mc.in = append(mc.in, termMasked...)
		} else {
			mc.in = append(mc.in, termUnmasked...)
		}
	}
	got, err := readAll(ws, b.msgs)
	if err != nil {
		t.Fatalf("gorilla failed after %d of %d messages in the prefix: %v (batch %+v)", len(got), b.msgs, err, b)
	}
	_, p, err := ws.ReadMessage()
	switch {
	case b.term && err != nil:
		t.Fatalf("terminator: %v (batch %+v)", err, b)
	case b.term && len(p) != 0:
		t.Fatalf("terminator read as %q", p)
	case !b.term && b.stop == stopShort && !errors.Is(err, errMemEnd):
		t.Fatalf("after the prefix gorilla returned %v, want it to ask for more (batch %+v)", err, b)
	case b.stop != stopShort && (err == nil || errors.Is(err, errMemEnd)):
		t.Fatalf("prefix ends in stop %d, gorilla returned %v", b.stop, err)
	case b.stop == stopTooBig && !errors.Is(err, websocket.ErrReadLimit):
		t.Fatalf("stopTooBig, gorilla returned %v", err)
	}
	if b.term {
		if _, _, err := ws.ReadMessage(); !errors.Is(err, errMemEnd) {
			t.Fatalf("after the terminator gorilla returned %v, want it to ask for more", err)
		}
	}

	whole, _, err := memGorilla(o.server, o.limit)
	if err != nil {
		t.Fatal(err)
	}
	mcWhole := whole.UnderlyingConn().(*memConn)
	mcWhole.in = slices.Clone(in)
	all, err := readAll(whole, len(in)/2+1)
	if len(all) != b.msgs {
		t.Fatalf("gorilla finds %d messages in the input, the scan %d (batch %+v, then %v)", len(all), b.msgs, b, err)
	}
	for i := range all {
		if !bytes.Equal(all[i], got[i]) {
			t.Fatalf("message %d differs: %q vs %q", i, all[i], got[i])
		}
	}
	if short := errors.Is(err, errMemEnd); short != (b.stop == stopShort) {
		t.Fatalf("whole input ends with %v, scan stop %d", err, b.stop)
	}
}

func FuzzScan(f *testing.F) {
	m := func(op byte, fin bool, p string) []byte { return frame(op, fin, true, []byte(p)) }
	f.Add(slices.Concat(m(opText, false, "a"), m(opPing, true, "x"), m(opCont, true, "b"), m(opPong, true, "")), true, uint8(10))
	f.Add(slices.Concat(m(opBinary, true, "abc"), m(opClose, true, "\x03\xe8bye")), true, uint8(0))
	f.Add(slices.Concat(frame(opText, true, false, []byte("srv")), frame(opPing, true, false, nil)), false, uint8(3))
	f.Add(frame(opBinary, true, true, make([]byte, 300)), true, uint8(200))
	f.Add([]byte{finBit | opBinary, maskBit | 127, 0x80, 0, 0, 0, 0, 0, 0, 0}, true, uint8(1))
	f.Fuzz(func(t *testing.T, in []byte, server bool, limit uint8) {
		checkAgainstGorilla(t, in, scanOpts{server: server, limit: 1 + int64(limit)})
	})
}
