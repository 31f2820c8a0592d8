//go:build linux

package wsread

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

const epollSupported = true

// armEvents: readable or hung up, one event until re-armed, so one worker
// at a time owns a connection.
const armEvents = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT

// poller is the epoll mode's engine: the epoll set, the table of
// registered connections, the resident workers' queue and the buffers.
type poller struct {
	s    *Server
	file *os.File // the epoll fd, non-blocking, waited on in the runtime's netpoller
	// rc is file's; epoll_ctl goes through its Control, so the epfd number
	// is never used once file is closed (it may name another file by then).
	rc   syscall.RawConn
	work chan *Conn
	bufs sync.Pool // *readBuf, of 2×ReadLimit+512 bytes
	// idle is the read buffer of every connection between batches: empty,
	// and never filled (see Conn.br).
	idle bufio.Reader

	mu sync.Mutex
	// conns are the registered connections, by fd (small numbers, most of
	// them a connection's: a table, not a map); removed before the
	// socket closes.
	conns   []*Conn
	gen     uint32
	stopped bool // workers are gone: dispatch runs a goroutine

	stop    chan struct{}
	spawned sync.WaitGroup // dispatches that found every worker busy
	pongs   sync.WaitGroup // Conn.writePongs
	once    sync.Once
}

func newPoller(s *Server) (*poller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("wsread: epoll_create1: %w", err)
	}
	if err := syscall.SetNonblock(epfd, true); err != nil {
		syscall.Close(epfd)
		return nil, fmt.Errorf("wsread: epoll fd non-blocking: %w", err)
	}
	size := int(2*s.cfg.ReadLimit + 512)
	p := &poller{
		s:    s,
		file: os.NewFile(uintptr(epfd), "wsread-epoll"),
		work: make(chan *Conn, 4*s.cfg.Workers),
		stop: make(chan struct{}),
	}
	p.bufs.New = func() any {
		return &readBuf{buf: make([]byte, 0, size), br: *bufio.NewReaderSize(nil, batchReadSize)}
	}
	p.idle = *bufio.NewReaderSize(nil, 16)
	if p.rc, err = p.file.SyscallConn(); err != nil {
		p.file.Close()
		return nil, fmt.Errorf("wsread: epoll fd: %w", err)
	}
	return p, nil
}

// ctl is epoll_ctl on the set, or os.ErrClosed once the set is closed.
func (p *poller) ctl(op int, fd int32, ev *syscall.EpollEvent) error {
	var err error
	if cerr := p.rc.Control(func(epfd uintptr) { err = syscall.EpollCtl(int(epfd), op, int(fd), ev) }); cerr != nil {
		return os.ErrClosed
	}
	return err
}

// stopping says Run is ending: its shutdown ends the connections left.
func (p *poller) stopping() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// run waits for events, runs the workers and the sweep until ctx is done,
// then ends every connection still registered (Closed(net.ErrClosed)).
func (p *poller) run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(p.loop)
	for range p.s.cfg.Workers {
		wg.Go(p.worker)
	}
	wg.Go(p.sweeper)
	<-ctx.Done()
	close(p.stop)
	p.close()
	wg.Wait()
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.spawned.Wait()
	p.shutdown()
	p.pongs.Wait() // bounded by pongWait: the sockets are closed
	return nil
}

// close releases the epoll fd; the loop's wait returns.
func (p *poller) close() { p.once.Do(func() { p.file.Close() }) }

// loop drains the epoll set whenever the runtime's netpoller says it is
// readable, and hands each connection to a worker.
func (p *poller) loop() {
	rc := p.rc
	events := make([]syscall.EpollEvent, 128)
	ready := make([]syscall.EpollEvent, 0, 128)
	for {
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, err := syscall.EpollWait(int(fd), events, 0)
				if err == syscall.EINTR {
					continue
				}
				if n <= 0 {
					return false // empty: park until the set is readable
				}
				ready = append(ready[:0], events[:n]...)
				return true
			}
		})
		if err != nil {
			return // closed
		}
		for _, ev := range ready {
			if c := p.claim(ev.Fd, uint32(ev.Pad)); c != nil {
				select {
				case p.work <- c:
				case <-p.stop:
					return
				}
			}
		}
	}
}

// claim finds the connection an event is for, unless it was deregistered
// or its fd now belongs to another connection (the generation differs),
// and marks it owned.
func (p *poller) claim(fd int32, gen uint32) *Conn {
	p.mu.Lock()
	var c *Conn
	if int(fd) < len(p.conns) {
		c = p.conns[fd]
	}
	p.mu.Unlock()
	if c == nil || c.gen != gen {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy || c.ended || !c.registered {
		return nil
	}
	c.busy = true
	return c
}

func (p *poller) worker() {
	for {
		select {
		case c := <-p.work:
			p.handle(c)
		case <-p.stop:
			return
		}
	}
}

// dispatch hands an owned connection to a worker without waiting: if every
// worker is busy (or gone), a goroutine of its own does it.
func (p *poller) dispatch(c *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped {
		select {
		case p.work <- c:
			return
		default:
		}
	}
	p.spawned.Go(func() { p.handle(c) })
}

// serve registers c; its pending bytes (frames sent with the handshake)
// are read at once.
func (p *poller) serve(c *Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.served = true
	switch {
	case c.closed:
		c.requestEnd(net.ErrClosed)
	default:
		p.mu.Lock()
		p.gen++
		c.gen = p.gen
		if n := int(c.fd) + 1; n > len(p.conns) {
			p.conns = append(p.conns, make([]*Conn, n-len(p.conns))...)
		}
		p.conns[c.fd] = c
		p.mu.Unlock()
		ev := syscall.EpollEvent{Events: armEvents, Fd: c.fd, Pad: int32(c.gen)}
		if err := p.ctl(syscall.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
			p.mu.Lock()
			p.conns[c.fd] = nil
			p.mu.Unlock()
			c.requestEnd(fmt.Errorf("wsread: epoll add: %w", err))
			if errors.Is(err, os.ErrClosed) {
				// Run has ended: as in goroutine mode, close it.
				c.end.err, c.closed = net.ErrClosed, true
				c.w.Conn.Close()
			}
			break
		}
		c.registered = true
		if len(c.w.pending) == 0 {
			return
		}
	}
	c.busy = true
	p.dispatch(c)
}

// arm re-arms c after a worker handled it. Called with c.mu held.
func (p *poller) arm(c *Conn) error {
	ev := syscall.EpollEvent{Events: armEvents, Fd: c.fd, Pad: int32(c.gen)}
	if err := p.ctl(syscall.EPOLL_CTL_MOD, c.fd, &ev); err != nil {
		return fmt.Errorf("wsread: epoll re-arm: %w", err)
	}
	return nil
}

// deregister removes c from the table and the epoll set, before its
// socket is closed, so its fd number can be reused safely. Called with
// c.mu held.
func (p *poller) deregister(c *Conn) {
	p.mu.Lock()
	if int(c.fd) < len(p.conns) && p.conns[c.fd] == c {
		p.conns[c.fd] = nil
	}
	p.mu.Unlock()
	p.ctl(syscall.EPOLL_CTL_DEL, c.fd, nil)
	c.registered = false
}

// handle is one turn of an owned connection: read and deliver, then
// re-arm it or end it.
func (p *poller) handle(c *Conn) {
	c.mu.Lock()
	req := c.endReq
	c.mu.Unlock()
	var reason error
	end := false
	if !req {
		reason, end = p.readEvent(c)
	}
	c.mu.Lock()
	if !end && c.endReq {
		reason, end = c.end.reason(), true
	}
	if !end && c.registered {
		// Re-arming fails once Run closed the set; shutdown then ends c
		// (closed, Closed(net.ErrClosed)) as it does every registered one.
		if err := p.arm(c); err != nil && !p.stopping() {
			reason, end = err, true
		}
	}
	if !end && !c.registered {
		reason, end = net.ErrClosed, true
	}
	if !end {
		c.busy = false
		c.mu.Unlock()
		return
	}
	c.ended, c.busy = true, false
	if c.registered {
		p.deregister(c)
	}
	c.mu.Unlock()
	p.closed(c, reason)
}

// closed calls the handler's Closed; a panic there is not allowed to take
// the shared worker down.
func (p *poller) closed(c *Conn, reason error) {
	defer func() { recover() }()
	c.h.Closed(reason)
}

// expire ends c if its linger or its read deadline passed by now.
func (p *poller) expire(c *Conn, now int64) {
	c.mu.Lock()
	if c.ended || c.endReq {
		c.mu.Unlock()
		return
	}
	if l := c.lingerUntil.Load(); l != 0 {
		if now <= l {
			c.mu.Unlock()
			return
		}
		c.requestEnd(c.end.lingerReason())
	} else if d := c.w.deadline.Load(); d != 0 && now > d {
		c.requestEnd(ErrIdle)
	} else {
		c.mu.Unlock()
		return
	}
	dispatch := !c.busy
	c.busy = true
	c.mu.Unlock()
	if dispatch {
		p.dispatch(c)
	}
}

// sweeper checks read deadlines and lingers every SweepInterval.
func (p *poller) sweeper() {
	t := time.NewTicker(p.s.cfg.SweepInterval)
	defer t.Stop()
	var due []*Conn
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		due = due[:0]
		p.mu.Lock()
		for _, c := range p.conns {
			if c != nil && pastDue(c, now) {
				due = append(due, c)
			}
		}
		p.mu.Unlock()
		for _, c := range due {
			p.expire(c, now)
		}
		clear(due)
	}
}

func pastDue(c *Conn, now int64) bool {
	if l := c.lingerUntil.Load(); l != 0 {
		return now > l
	}
	d := c.w.deadline.Load()
	return d != 0 && now > d
}

// shutdown ends every connection still registered once the workers are
// gone: its socket is closed and Closed(net.ErrClosed) called here.
func (p *poller) shutdown() {
	// Queued connections are owned by nobody now. Some are no longer in
	// the table (closed here, their Closed still due): end them too.
	var left []*Conn
	for drained := false; !drained; {
		select {
		case c := <-p.work:
			left = append(left, c)
		default:
			drained = true
		}
	}
	p.mu.Lock()
	for _, c := range p.conns {
		if c != nil {
			left = append(left, c)
		}
	}
	clear(p.conns)
	p.mu.Unlock()
	for _, c := range left {
		c.mu.Lock()
		if c.ended {
			c.mu.Unlock()
			continue
		}
		c.ended, c.registered = true, false
		if !c.closed {
			c.closed = true
			c.w.Conn.Close()
		}
		c.mu.Unlock()
		p.closed(c, net.ErrClosed)
	}
}

// borrow lends c a worker's read buffer, for Upgrade: gorilla keeps the
// reader it is handed only if it has more than 256 bytes.
func (p *poller) borrow(c *Conn) *readBuf {
	rb := p.bufs.Get().(*readBuf)
	c.lend(rb)
	return rb
}

// giveBack ends a borrow: c's reader holds the idle buffer again.
func (p *poller) giveBack(c *Conn, rb *readBuf) {
	c.unlend(&p.idle)
	p.bufs.Put(rb)
}

// rawConn is c's socket, to read without waiting; made for each turn, so
// that a connection keeps none.
func (c *Conn) rawConn() (syscall.RawConn, error) {
	return c.w.Conn.(syscall.Conn).SyscallConn()
}

// readSocket reads what the socket (rc, c's) holds without waiting: n
// bytes, eof when the peer hung up, or an error. The func given to
// RawConn.Read returns true, so the runtime never parks on it.
func (c *Conn) readSocket(rc syscall.RawConn, p []byte) (n int, eof bool, err error) {
	var rerr error
	cerr := rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), p)
			if rerr != syscall.EINTR {
				return true
			}
		}
	})
	switch {
	case cerr != nil:
		if errors.Is(cerr, net.ErrClosed) || errors.Is(cerr, os.ErrClosed) {
			return 0, false, net.ErrClosed
		}
		return 0, false, cerr
	case rerr == syscall.EAGAIN:
		return 0, false, nil
	case rerr != nil:
		return 0, false, &net.OpError{Op: "read", Net: "tcp", Source: c.w.LocalAddr(), Addr: c.w.RemoteAddr(), Err: os.NewSyscallError("read", rerr)}
	case n == 0 && len(p) > 0:
		return 0, true, nil
	}
	return n, false, nil
}
