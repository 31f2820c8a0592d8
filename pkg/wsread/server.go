package wsread

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

// Server reads the connections it upgraded or dialed. Open it with New,
// run it with Run, stop it with Close (or Run's context).
type Server struct {
	cfg Config
	p   *poller // epoll mode only

	closing   chan struct{}
	closeOnce sync.Once

	// Connections read by their own goroutine (goroutine mode, or without
	// a file descriptor), so that Run can end them.
	gmu    sync.Mutex
	gconns map[*Conn]struct{}
	gwg    sync.WaitGroup
	gdone  bool

	onRead func(n int) // tests: bytes read from a socket (epoll)
}

// New checks cfg and opens a Server (in epoll mode, its epoll set).
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, closing: make(chan struct{}), gconns: make(map[*Conn]struct{})}
	if cfg.Mode == ModeEpoll {
		if s.p, err = newPoller(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Mode is the mode the Server reads in.
func (s *Server) Mode() Mode { return s.cfg.Mode }

// Run reads connections until ctx is done or Close is called (in goroutine
// mode it only waits). Before it returns, every connection still being
// read is closed and gets Closed(net.ErrClosed).
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	var err error
	if s.p != nil {
		err = s.p.run(ctx)
	} else {
		<-ctx.Done()
	}
	s.endGoroutines()
	return err
}

// Close stops Run. It does not wait for it.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.closing)
		if s.p != nil {
			s.p.close()
		}
	})
	return nil
}

// Upgrade is gorilla's Upgrade, with the adapter's conn under the returned
// websocket.Conn in epoll mode (plain gorilla in goroutine mode). In epoll
// mode bytes the client sent with its request become the first batch
// (plain gorilla v1.5.3 refuses them).
func (s *Server) Upgrade(u *websocket.Upgrader, w http.ResponseWriter, r *http.Request, h http.Header) (*Conn, error) {
	if s.p == nil {
		ws, err := u.Upgrade(w, r, h)
		if err != nil {
			return nil, err
		}
		return &Conn{ws: ws, s: s, fd: -1}, nil
	}
	// gorilla keeps the hijacker's reader as its read buffer only if no
	// size is set (see Hijack).
	uu := *u
	uu.ReadBufferSize = 0
	hj := &hijacker{ResponseWriter: w, s: s, rsv1: u.EnableCompression, readSize: u.ReadBufferSize}
	ws, err := uu.Upgrade(hj, r, h)
	if hj.rb != nil {
		s.p.giveBack(hj.c, hj.rb)
	}
	if err != nil {
		return nil, err
	}
	hj.c.ws = ws
	if hj.c.fd >= 0 {
		ws.SetPingHandler(hj.c.pong)
	}
	return hj.c, nil
}

// hijacker hands gorilla the adapter's conn and an empty reader; what
// net/http had already buffered goes to the conn's pending bytes. For a
// connection read in batches the reader is the conn's own br, with a
// worker's buffer lent for the handshake (rb): gorilla keeps it as its
// read buffer, which holds no buffer of its own between batches (see
// Conn.br). For one read by a goroutine it is a reader of the upgrader's
// size, which gorilla keeps as well.
type hijacker struct {
	http.ResponseWriter
	s        *Server
	rsv1     bool
	readSize int // the upgrader's ReadBufferSize
	c        *Conn
	rb       *readBuf // lent to c's br until Upgrade returns
}

func (h *hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("wsread: response does not implement http.Hijacker")
	}
	nc, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		p, _ := brw.Reader.Peek(n)
		pending = append([]byte(nil), p...)
	}
	h.c = h.s.newConn(nc, false, h.rsv1, pending)
	if h.c.w.mode == wireBatch {
		h.c.borrows = true
		h.rb = h.s.p.borrow(h.c)
		return &h.c.w, bufio.NewReadWriter(&h.c.br, brw.Writer), nil
	}
	return &h.c.w, bufio.NewReadWriter(bufio.NewReaderSize(&h.c.w, passReadSize(h.readSize)), brw.Writer), nil
}

// passReadSize is the read buffer of a connection that a goroutine reads
// through gorilla (no file descriptor) for an upgrader's ReadBufferSize
// of n: gorilla's default for 0, and at least 257 bytes, the least that
// gorilla keeps of a hijacker's reader.
func passReadSize(n int) int {
	if n == 0 {
		return 4096
	}
	return max(n, 257)
}

// newConn wraps a socket. With a file descriptor and the epoll mode it is
// read in batches; without (TLS), reads pass through and a goroutine of
// its own reads it.
func (s *Server) newConn(nc net.Conn, dialed, rsv1 bool, pending []byte) *Conn {
	c := &Conn{s: s, fd: -1}
	c.w = wire{Conn: nc, c: c, mode: wirePass, dialed: dialed, rsv1: rsv1, pending: pending}
	if s.p == nil {
		return c
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	fd := -1
	if rc.Control(func(f uintptr) { fd = int(f) }) != nil || fd < 0 {
		return c
	}
	// The socket is read through rc: a deadline net/http left on it would
	// fail those reads.
	nc.SetReadDeadline(time.Time{})
	c.fd = int32(fd)
	if !dialed {
		c.w.mode = wireBatch
	}
	return c
}

// Dial is the client side (for a load generator): gorilla's Dialer with
// the adapter under it in epoll mode. Server frames are unmasked, so the
// scan and the terminator follow the role. Frames the server sent right
// after its 101 response become the first batch. wss and proxies are not
// supported in epoll mode.
func (s *Server) Dial(ctx context.Context, d *websocket.Dialer, url string, h http.Header) (*Conn, *http.Response, error) {
	if d == nil {
		d = websocket.DefaultDialer
	}
	if s.p == nil {
		ws, resp, err := d.DialContext(ctx, url, h)
		if err != nil {
			return nil, resp, err
		}
		return &Conn{ws: ws, s: s, fd: -1}, resp, nil
	}
	dd := *d
	dial := d.NetDialContext
	if dial == nil {
		var nd net.Dialer
		dial = nd.DialContext
	}
	var c *Conn
	dd.NetDialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c = s.newConn(nc, true, d.EnableCompression, nil)
		c.w.mode = wireHandshake
		return &c.w, nil
	}
	dd.NetDialTLSContext = nil
	ws, resp, err := dd.DialContext(ctx, url, h)
	if err != nil {
		return nil, resp, err
	}
	if c == nil || c.w.Conn == nil || ws.UnderlyingConn() != &c.w {
		ws.Close()
		return nil, resp, fmt.Errorf("wsread: dial %s: the connection is not the adapter's (wss or a proxy?)", url)
	}
	c.ws = ws
	if c.fd >= 0 {
		c.w.mode = wireBatch
		ws.SetPingHandler(c.pong)
	}
	return c, resp, nil
}

// Serve starts reading c into h. Nothing reads c before it. It sets
// gorilla's read limit to Config.ReadLimit.
func (s *Server) Serve(c *Conn, h Handler) {
	c.h = h
	c.ws.SetReadLimit(s.cfg.ReadLimit)
	if c.w.mode == wireBatch {
		s.p.serve(c)
		return
	}
	s.serveGoroutine(c)
}
