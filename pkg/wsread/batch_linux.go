//go:build linux

package wsread

import (
	"errors"
	"io"
	"time"

	"github.com/gorilla/websocket"
)

// errPeerGone is what gorilla returns when the peer hangs up without a
// close frame (its errUnexpectedEOF).
func errPeerGone() error {
	return &websocket.CloseError{Code: websocket.CloseAbnormalClosure, Text: io.ErrUnexpectedEOF.Error()}
}

// maxRounds caps the socket reads per event: a flood on one connection
// gets a bounded turn, then goes back to epoll behind the others.
const maxRounds = 4

// readEvent reads what c's socket holds and delivers the whole messages in
// it, keeping an incomplete tail for the next event. end says reading is
// over, with reason.
func (p *poller) readEvent(c *Conn) (reason error, end bool) {
	rc, err := c.rawConn()
	if err != nil {
		return err, true
	}
	rb := p.bufs.Get().(*readBuf)
	defer p.bufs.Put(rb)
	buf := append(rb.buf[:0], c.w.pending...)
	c.w.pending = nil // freed once used
	for range maxRounds {
		space := len(buf[len(buf):cap(buf)])
		n, eof, err := c.readSocket(rc, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if p.s.onRead != nil {
			p.s.onRead(n)
		}
		if c.lingering() {
			buf = buf[:0]
		} else if used, reason, end := p.deliver(c, rb, buf); end {
			return reason, true
		} else {
			buf = buf[:copy(buf, buf[used:])]
		}
		switch {
		case eof && c.lingering():
			return c.lingerReason(), true
		case eof:
			return errPeerGone(), true
		case err != nil:
			return err, true
		case len(buf) == cap(buf):
			// An incomplete message fills the whole buffer: its frames
			// (tiny fragments, control frames between them) outgrow what
			// its size allows.
			c.ws.WriteControl(websocket.CloseMessage,
				websocket.FormatCloseMessage(websocket.CloseMessageTooBig, ""), time.Now().Add(time.Second))
			c.startLinger(p.s.cfg.Linger, websocket.ErrReadLimit)
			return nil, false
		case n < space:
			// Most likely drained; if not, the re-arm fires again.
			if len(buf) > 0 && !c.lingering() {
				c.w.pending = append([]byte(nil), buf...)
			}
			return nil, false
		}
	}
	if len(buf) > 0 && !c.lingering() {
		c.w.pending = append([]byte(nil), buf...)
	}
	return nil, false
}

// deliver shows gorilla the longest ready prefix of buf (rb's) and hands
// its messages to the handler, gorilla reading through rb's read buffer
// when c borrows one. used is how much of buf gorilla consumed.
func (p *poller) deliver(c *Conn, rb *readBuf, buf []byte) (used int, reason error, end bool) {
	b := scan(buf, scanOpts{server: !c.w.client(), rsv1: c.w.rsv1, limit: p.s.cfg.ReadLimit})
	calls := b.calls()
	if calls == 0 {
		return 0, nil, false
	}
	rb.batch = buf[:b.n]
	if b.term {
		rb.term = termMasked
		if c.w.client() {
			rb.term = termUnmasked
		}
	}
	c.w.rb = rb
	if c.borrows {
		c.lend(rb)
	}
	defer func() {
		c.w.rb, rb.batch, rb.term = nil, nil, nil
		if c.borrows {
			c.unlend(&p.idle)
		}
	}()
	for i := range calls {
		typ, data, err := readMessage(c.ws, &rb.msg)
		last := i == calls-1
		switch {
		case err != nil && last && b.stop != stopShort && !isCloseError(err):
			// gorilla sent 1002 or 1009: give the peer time to read it.
			c.startLinger(p.s.cfg.Linger, err)
			return b.n, nil, false
		case err != nil:
			return b.n, err, true
		case b.term && i == b.msgs:
			if typ != websocket.TextMessage || len(data) != 0 {
				return b.n, errors.New("wsread: terminator not where the scan put it"), true
			}
			continue
		case c.lingering() || c.endRequested():
			continue // dropped
		}
		ok, err := c.message(typ, data)
		if err != nil {
			return b.n, err, true
		}
		if !ok && !c.lingering() {
			return b.n, nil, true
		}
	}
	// Unread bytes in gorilla's buffer would be lost with the lent one.
	if len(rb.batch) != 0 || len(rb.term) != 0 || c.br.Buffered() != 0 {
		return b.n, errors.New("wsread: gorilla left part of a batch unread"), true
	}
	return b.n, nil, false
}

// readMessage is gorilla's ReadMessage, reading the message into *buf,
// which it keeps for the next: one allocation per worker, not one per
// message (io.ReadAll's, the gateway's largest per ping). Like
// ReadMessage it returns what it read with a read error.
func readMessage(ws *websocket.Conn, buf *[]byte) (int, []byte, error) {
	typ, r, err := ws.NextReader()
	if err != nil {
		return typ, nil, err
	}
	b := (*buf)[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // room to read into
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			*buf = b
			if err == io.EOF {
				err = nil
			}
			return typ, b, err
		}
	}
}
