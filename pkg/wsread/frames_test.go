package wsread

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"time"

	"github.com/gorilla/websocket"
)

// frame builds one frame; masked frames use a fixed key, as a client would.
func frame(op byte, fin, masked bool, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= finBit
	}
	var mb byte
	if masked {
		mb = maskBit
	}
	out := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		out = append(out, mb|byte(n))
	case n <= 0xffff:
		out = append(out, mb|126, byte(n>>8), byte(n))
	default:
		out = append(out, mb|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	if !masked {
		return append(out, payload...)
	}
	key := [4]byte{0x37, 0xfa, 0x21, 0x3d}
	out = append(out, key[:]...)
	for i, c := range payload {
		out = append(out, c^key[i%4])
	}
	return out
}

// errMemEnd is what memConn's Read returns past its input: gorilla asked
// for a byte that was not there.
var errMemEnd = errors.New("memconn: read past the input")

// memConn is an in-memory net.Conn: reads come from in, writes are kept.
type memConn struct {
	in      []byte
	out     bytes.Buffer
	onWrite func(c *memConn, p []byte)
}

func (c *memConn) Read(p []byte) (int, error) {
	if len(c.in) == 0 {
		return 0, errMemEnd
	}
	n := copy(p, c.in)
	c.in = c.in[n:]
	return n, nil
}

func (c *memConn) Write(p []byte) (int, error) {
	c.out.Write(p)
	if c.onWrite != nil {
		c.onWrite(c, p)
	}
	return len(p), nil
}

func (c *memConn) Close() error                     { return nil }
func (c *memConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *memConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

type memHijacker struct {
	http.ResponseWriter
	c *memConn
}

func (h memHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return h.c, bufio.NewReadWriter(bufio.NewReader(h.c), bufio.NewWriter(h.c)), nil
}

func acceptKey(key string) string {
	h := sha1.New()
	h.Write([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

var keyLine = regexp.MustCompile(`(?i)Sec-Websocket-Key: (\S+)\r\n`)

// memGorilla returns a gorilla Conn in the given role over a memConn, with
// the handshake done; set the memConn's in to feed it.
func memGorilla(server bool, limit int64) (*websocket.Conn, *memConn, error) {
	mc := &memConn{}
	var ws *websocket.Conn
	var err error
	if server {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-Websocket-Version", "13")
		r.Header.Set("Sec-Websocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		u := websocket.Upgrader{ReadBufferSize: 128}
		ws, err = u.Upgrade(memHijacker{httptest.NewRecorder(), mc}, r, nil)
	} else {
		mc.onWrite = func(c *memConn, p []byte) {
			m := keyLine.FindSubmatch(p)
			if m == nil || c.in != nil {
				return
			}
			c.in = []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
				acceptKey(string(m[1])) + "\r\n\r\n")
		}
		d := websocket.Dialer{ReadBufferSize: 128, NetDialContext: func(context.Context, string, string) (net.Conn, error) { return mc, nil }}
		ws, _, err = d.Dial("ws://example.invalid/", nil)
	}
	if err != nil {
		return nil, nil, err
	}
	ws.SetReadLimit(limit)
	mc.out.Reset()
	return ws, mc, nil
}

// readAll runs ReadMessage on ws until it fails or max messages came.
func readAll(ws *websocket.Conn, max int) (msgs [][]byte, err error) {
	for len(msgs) < max {
		_, p, err := ws.ReadMessage()
		if err != nil {
			return msgs, err
		}
		msgs = append(msgs, p)
	}
	return msgs, nil
}
