package wsread

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// Handler receives one connection's messages and its end.
type Handler interface {
	// Message is one whole data message. Calls for one connection never
	// overlap and come in order; in epoll mode they run on a shared worker
	// and must not block. data is valid only during the call: in epoll
	// mode the worker reads every message into memory it reuses for the
	// next (a copy is the handler's to make).
	// false stops reading: the connection lingers if Linger was called,
	// then Closed(nil).
	Message(typ int, data []byte) bool
	// Closed is called exactly once when reading has ended, with why:
	// *websocket.CloseError (the peer's close, which gorilla answered),
	// websocket.ErrReadLimit (gorilla sent 1009; lingered first), another
	// gorilla protocol error (gorilla sent 1002; lingered first), ErrIdle
	// (past the read deadline), net.ErrClosed (closed here), a
	// *websocket.CloseError with code 1006 (the peer hung up without a
	// close frame, as gorilla reports it), another read error, or nil
	// after Message returned false or a Linger ended. The caller closes
	// the connection (ws.Close) afterwards if it wants; Closed must not
	// block (it runs on a worker in epoll mode).
	Closed(err error)
}

// Conn is one WebSocket connection as wsread reads it.
type Conn struct {
	ws *websocket.Conn
	w  wire // what ws reads from and writes to in epoll mode
	s  *Server
	h  Handler

	fd  int32  // -1: no file descriptor (read by a goroutine)
	gen uint32 // tells this registration of fd from a later one

	// mu guards the state below, and orders epoll registration against
	// Close: the table entry and EPOLL_CTL_DEL go before the socket closes.
	mu         sync.Mutex
	served     bool // Serve was called
	busy       bool // a worker owns the connection (or it is queued for one)
	registered bool // in the poller's table and epoll set
	closed     bool // the socket is closed
	ended      bool // Closed was called (or is being called)
	endReq     bool // reading must end with end.err when the owner looks
	// borrows: gorilla reads through br (an upgraded connection in
	// batch mode); see br. Fixed once the connection is made.
	borrows bool
	end     *ending // nil until an end is requested or a linger has a reason
	// pongs are the payloads of the pings writePongs has yet to answer;
	// not nil while writePongs runs (epoll).
	pongs       *[]string
	lingerUntil atomic.Int64

	// br is gorilla's read buffer when borrows (the hijacker hands it to
	// gorilla, which keeps it as its own). Between batches it holds the
	// poller's shared empty buffer, and nothing reads it; for a batch it
	// borrows the worker's buffer (lend), and gives it back empty
	// (unlend). An idle connection so holds no read buffer of its own.
	br bufio.Reader
}

// WS is the gorilla connection: write with it (WriteMessage, WriteControl,
// NextWriter) and set handlers and deadlines on it; do not read from it.
func (c *Conn) WS() *websocket.Conn { return c.ws }

// Linger makes reading go on, dropping input, until the peer hangs up or d
// passes, then Closed(nil). Call it from Message (before returning false),
// or from any goroutine after Serve. In epoll mode the end is found by the
// sweep, up to Config.SweepInterval late.
func (c *Conn) Linger(d time.Duration) {
	until := time.Now().Add(d).UnixNano()
	if c.fd < 0 {
		c.lingerUntil.Store(until)
		c.ws.UnderlyingConn().SetReadDeadline(time.Unix(0, until))
		return
	}
	c.mu.Lock()
	if !c.ended && c.lingerUntil.Load() == 0 {
		c.lingerUntil.Store(until)
	}
	c.mu.Unlock()
}

// Discard is Linger for a connection that will not be served: on the
// caller's goroutine, it reads and drops input until the peer hangs up or
// d passes, so that closing the socket after a close frame does not reset
// the connection and lose the frame. Call it only before Serve, or
// instead of it.
func (c *Conn) Discard(d time.Duration) {
	nc := c.ws.UnderlyingConn()
	if c.fd >= 0 {
		nc = c.w.Conn // the socket itself: the wire never waits
	}
	nc.SetReadDeadline(time.Now().Add(d))
	io.Copy(io.Discard, nc)
}

func (c *Conn) lingering() bool { return c.lingerUntil.Load() != 0 }

// close is the wire's Close: deregister (table, then EPOLL_CTL_DEL) while
// the fd is still ours, close the socket, and make sure Closed comes once.
func (c *Conn) close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if c.registered {
		c.s.p.deregister(c)
	}
	err := c.w.Conn.Close()
	dispatch := false
	if c.served && !c.ended {
		if !c.endReq {
			c.requestEnd(net.ErrClosed)
		}
		if !c.busy {
			c.busy, dispatch = true, true
		}
	}
	c.mu.Unlock()
	if dispatch {
		c.s.p.dispatch(c)
	}
	return err
}

// ending is why reading ends: made when an end is requested, or a linger
// is given a reason, so that a connection holds none of it until then.
// Guarded by the conn's mu.
type ending struct {
	err    error // why reading ends once endReq is set
	linger error // given to Closed when a linger ends
}

// reason is why reading ends (endReq is set).
func (e *ending) reason() error { return e.err }

// lingerReason is what Closed gets when a linger ends: nil unless the
// linger was started with a reason.
func (e *ending) lingerReason() error {
	if e == nil {
		return nil
	}
	return e.linger
}

// ending returns c's ending, made if need be. c.mu is held.
func (c *Conn) ending() *ending {
	if c.end == nil {
		c.end = &ending{}
	}
	return c.end
}

// requestEnd makes reading end with err when the owner looks. c.mu is
// held.
func (c *Conn) requestEnd(err error) {
	c.endReq = true
	c.ending().err = err
}

// errNotReady is the wire's answer when gorilla asks for bytes outside the
// batch. It cannot happen unless the scan and gorilla disagree; it ends
// the connection instead of parking a goroutine.
var errNotReady = errors.New("wsread: gorilla read past the ready bytes")

type wireMode uint8

const (
	// wirePass: reads pass through to the socket (after pending bytes);
	// the connection is read by its own goroutine.
	wirePass wireMode = iota
	// wireHandshake: a client's handshake; reads pass through, but stop at
	// the end of the response header, so gorilla's buffer holds no frame.
	wireHandshake
	// wireBatch: reads come only from the batch the worker set.
	wireBatch
)

// wire is the net.Conn under gorilla. Writes, addresses and write
// deadlines go to the socket; reads and read deadlines depend on mode.
type wire struct {
	net.Conn
	c       *Conn
	mode    wireMode
	dialed  bool  // we are the client: frames from the peer are unmasked
	rsv1    bool  // compression may be negotiated (gorilla accepts RSV1)
	hsMatch uint8 // bytes of "\r\n\r\n" matched (wireHandshake)
	// rb holds the batch being delivered (its batch and term), nil
	// between batches: the worker's, not the connection's (wireBatch).
	rb *readBuf
	// pending: bytes read from the socket that gorilla has not seen:
	// incomplete frames (wireBatch), or frames that came with the
	// handshake (they become the first batch).
	pending  []byte
	deadline atomic.Int64 // read deadline, Unix ns; 0: none (wireBatch)
}

// batchReadSize is gorilla's read buffer while it reads a batch: the
// worker's, lent to the connection (see Conn.br). Above 256 bytes, so
// that gorilla's Upgrade keeps the reader the hijacker hands it.
const batchReadSize = 512

// readBuf is what a worker reads one connection's turn with (pooled, the
// worker's while it runs): the bytes read from the socket, the batch
// gorilla is shown of them, and the read buffer gorilla reads it through.
type readBuf struct {
	buf   []byte // socket reads: 2×ReadLimit+512 bytes
	batch []byte // what gorilla may still read of this batch
	term  []byte // the terminator after batch, if the batch needs one
	msg   []byte // each message of the batch, read in turn (readMessage)
	// br is lent to the connection being read (Conn.lend), by copy: it
	// is only a template for its buffer and never read itself.
	br bufio.Reader
}

// lend makes rb's read buffer c's, empty, for gorilla to read a batch
// through (or, during Upgrade, to see a buffer it keeps as its own).
func (c *Conn) lend(rb *readBuf) {
	c.br = rb.br
	c.br.Reset(&c.w)
}

// unlend gives the lent buffer back: c.br then holds idle's, shared by
// every idle connection and never filled (a read outside a batch gets
// errNotReady from the wire before it could store a byte).
func (c *Conn) unlend(idle *bufio.Reader) {
	c.br = *idle
	c.br.Reset(&c.w)
}

func (w *wire) client() bool { return w.dialed }

func (w *wire) Read(p []byte) (int, error) {
	switch w.mode {
	case wireBatch:
		rb := w.rb
		if rb == nil {
			return 0, errNotReady
		}
		if len(rb.batch) > 0 {
			n := copy(p, rb.batch)
			rb.batch = rb.batch[n:]
			return n, nil
		}
		if len(rb.term) > 0 {
			n := copy(p, rb.term)
			rb.term = rb.term[n:]
			return n, nil
		}
		return 0, errNotReady
	case wireHandshake:
		return w.readHandshake(p)
	}
	if len(w.pending) > 0 {
		n := copy(p, w.pending)
		w.pending = w.pending[n:]
		if len(w.pending) == 0 {
			w.pending = nil
		}
		return n, nil
	}
	return w.Conn.Read(p)
}

// readHandshake passes reads through up to the blank line ending the
// HTTP response header and keeps what follows (frames the server sent
// right after its 101) in pending. A 101 response has no body, so gorilla
// never asks for more.
func (w *wire) readHandshake(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	for i := 0; i < n; i++ {
		w.hsMatch = nextMatch(w.hsMatch, p[i])
		if w.hsMatch == 4 {
			w.pending = append(w.pending, p[i+1:n]...)
			w.mode = wirePass // until the batch mode starts
			return i + 1, nil
		}
	}
	return n, err
}

// nextMatch advances the match of "\r\n\r\n" by one byte.
func nextMatch(m uint8, b byte) uint8 {
	switch {
	case b == '\r' && (m == 0 || m == 2):
		return m + 1
	case b == '\n' && (m == 1 || m == 3):
		return m + 1
	case b == '\r':
		return 1
	}
	return 0
}

func (w *wire) SetReadDeadline(t time.Time) error {
	if w.mode != wireBatch {
		return w.Conn.SetReadDeadline(t)
	}
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	w.deadline.Store(ns)
	return nil
}

func (w *wire) SetDeadline(t time.Time) error {
	if w.mode != wireBatch {
		return w.Conn.SetDeadline(t)
	}
	w.SetReadDeadline(t)
	return w.Conn.SetWriteDeadline(t)
}

func (w *wire) Close() error {
	if w.mode != wireBatch {
		return w.Conn.Close()
	}
	return w.c.close()
}

// message calls the handler; a panic ends this connection only.
func (c *Conn) message(typ int, data []byte) (ok bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("wsread: handler panicked: %v", r)
		}
	}()
	return c.h.Message(typ, data), nil
}

func (c *Conn) endRequested() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endReq
}

// startLinger starts dropping input for d; Closed gets err when it ends.
func (c *Conn) startLinger(d time.Duration, err error) {
	c.mu.Lock()
	c.ending().linger = err
	c.lingerUntil.Store(time.Now().Add(d).UnixNano())
	c.mu.Unlock()
}

func (c *Conn) lingerReason() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.end.lingerReason()
}

// pongWait bounds writing a pong, as gorilla's own ping handler does.
const pongWait = time.Second

// maxPongs bounds the pongs waiting on one connection; past it the oldest
// are dropped (RFC 6455 §5.5.3 allows answering only the latest ping).
const maxPongs = 32

// pong is the ping handler in epoll mode. gorilla's own writes the pong
// inside ReadMessage, on the worker, waiting up to a second per ping for
// the write lock; an application writer holds that lock for as long as its
// write blocks on a peer that does not read (up to its write deadline), so
// a few such peers pinging would stall every worker. The pongs go out in
// order on a goroutine instead, one per connection at most and only while
// a pong is due.
func (c *Conn) pong(data string) error {
	c.mu.Lock()
	start := c.pongs == nil
	if start {
		c.pongs = new([]string)
	}
	q := c.pongs
	if len(*q) == maxPongs {
		*q = (*q)[1:]
	}
	*q = append(*q, data)
	c.mu.Unlock()
	if start {
		c.s.p.pongs.Go(c.writePongs)
	}
	return nil
}

func (c *Conn) writePongs() {
	for {
		c.mu.Lock()
		q := c.pongs
		if len(*q) == 0 {
			c.pongs = nil
			c.mu.Unlock()
			return
		}
		data := (*q)[0]
		*q = (*q)[1:]
		c.mu.Unlock()
		// Errors are the writer's to see: a failed write is fatal to
		// every later one.
		c.ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(pongWait))
	}
}

func isCloseError(err error) bool {
	var ce *websocket.CloseError
	return errors.As(err, &ce)
}
