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
	"sync/atomic"
	"syscall"
	"time"
)

const epollSupported = true

// armEvents: readable or hung up, one event until re-armed, so one worker
// at a time owns a connection.
const armEvents = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT

// poller is the epoll mode's engine: the epoll set, the table of
// registered connections, the resident workers and the buffers.
//
// The workers take turns at the set: the one whose turn it is waits for
// events in the runtime's netpoller (see lead). While the set is quiet it
// reads the connection it takes itself, then waits again: a ping is read
// and handled on the goroutine that took its event, with no hand-off to
// another goroutine between and no other goroutine woken. A hand-off
// queued the handling behind whatever else the scheduler had, such as a
// renewal flush whose timer fell due in the same moment, which then went
// without the renewal that ping asked for. While the set is busy, one
// wait takes every event ready, and the other workers handle them: a
// wait for each would cost a system call each.
type poller struct {
	s    *Server
	file *os.File // the epoll fd, non-blocking, waited on in the runtime's netpoller
	// rc is file's; epoll_ctl goes through its Control, so the epfd number
	// is never used once file is closed (it may name another file by then).
	rc syscall.RawConn
	// token is the turn at the set (one, in a channel of one): the worker
	// that holds it waits for events, the others wait for it or for work.
	// It is handed on by whoever ends the turn: the worker, or the watch,
	// for a worker in a slow handler.
	token chan struct{}
	// work is the events a busy turn took beyond the one its worker
	// handles, in the set's order, for the other workers.
	work chan syscall.EpollEvent
	// handling is the turn's handler state, for the watch: a number each
	// handle gets (<<2), |1 while the turn's worker is in it, |2 once the
	// watch ended the turn (see lead).
	handling atomic.Uint64
	handles  atomic.Uint64 // numbers the handles
	taken    atomic.Int64  // turns the watch ended
	// watchIdle: the watch found no handle for a while and waits on
	// watchWake, which the next handle of a kept turn sends on.
	watchIdle atomic.Bool
	watchWake chan struct{}
	bufs      sync.Pool // *readBuf, of 2×ReadLimit+512 bytes
	// idle is the read buffer of every connection between batches: empty,
	// and never filled (see Conn.br).
	idle bufio.Reader

	mu sync.Mutex
	// conns are the registered connections, by fd (small numbers, most of
	// them a connection's: a table, not a map); removed before the
	// socket closes.
	conns   []*Conn
	gen     uint32
	stopped bool // the workers are gone: dispatch no longer counts in spawned

	stop    chan struct{}
	spawned sync.WaitGroup // dispatches until the workers are gone: each runs a goroutine
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
		s:         s,
		file:      os.NewFile(uintptr(epfd), "wsread-epoll"),
		stop:      make(chan struct{}),
		token:     make(chan struct{}, 1),
		work:      make(chan syscall.EpollEvent, maxBatch),
		watchWake: make(chan struct{}, 1),
	}
	p.token <- struct{}{}
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

// stopping says Run is ending, or Close was called (which closes the set
// before Run's end begins): Run's shutdown ends the connections left.
func (p *poller) stopping() bool {
	select {
	case <-p.stop:
		return true
	case <-p.s.closing:
		return true
	default:
		return false
	}
}

// run waits for events, runs the workers and the sweep until ctx is done,
// then ends every connection still registered (Closed(net.ErrClosed)).
func (p *poller) run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range p.s.cfg.Workers {
		wg.Go(p.worker)
	}
	wg.Go(p.sweeper)
	wg.Go(p.watch)
	<-ctx.Done()
	close(p.stop)
	p.close()
	wg.Wait()
	// Dispatches from here on (a Close racing the end) run beside
	// shutdown, which ends a connection only once with them (see handle).
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.spawned.Wait()
	p.shutdown()
	p.pongs.Wait() // bounded by pongWait: the sockets are closed
	return nil
}

// close releases the epoll fd; the workers' waits return.
func (p *poller) close() { p.once.Do(func() { p.file.Close() }) }

// watchEvery is how often the watch looks at the turn's handler: one that
// it finds in the same handle twice, so between one and two of these,
// loses the turn to the next worker, so that a handler that blocks (or a
// worker the machine does not run) holds up the other connections no
// longer.
const watchEvery = 5 * time.Millisecond

// maxBatch is the most events one wait takes from a busy set.
const maxBatch = 128

// worker handles the events a busy turn left, or takes the turn at the
// set, until the set is closed; a busy turn's events come first.
func (p *poller) worker() {
	evs := make([]syscall.EpollEvent, maxBatch)
	for {
		select {
		case ev := <-p.work:
			p.handleEvent(ev)
			continue
		default:
		}
		select {
		case ev := <-p.work:
			p.handleEvent(ev)
		case <-p.token:
			if !p.lead(evs) {
				return
			}
		}
	}
}

// lead is a worker's turn at the set, in which it handles one event or,
// while the set is quiet, one after another: it waits for an event,
// handles it and waits again, and no other worker is woken. The set is
// busy when the wait found events ready, or more than one: then it puts
// all but the first in work, in the set's order, and hands the turn on,
// before it handles the first. The watch ends the turn for it when a
// handler is slow. lead reports false once the set is closed.
//
// Only the turn puts events in work, so while a worker holds it work
// does not fill: a wait takes no more events than work has room for
// besides its first, and a worker never waits on the set while work
// holds events, which might then wait for handlers that block.
func (p *poller) lead(evs []syscall.EpollEvent) bool {
	for {
		room := cap(p.work) - len(p.work)
		n, waited, err := p.next(evs[:1+min(room, len(evs)-1)])
		if err != nil {
			p.token <- struct{}{} // the next worker finds it closed too
			return false
		}
		if n == 0 {
			// Empty, and work holds events: they come first.
			p.token <- struct{}{}
			return true
		}
		if !waited || n > 1 || room == 0 {
			for _, ev := range evs[1:n] {
				p.work <- ev
			}
			p.token <- struct{}{}
			p.handleEvent(evs[0])
			return true
		}
		h := p.handles.Add(1) << 2
		p.handling.Store(h | 1)
		p.wakeWatch()
		p.handleEvent(evs[0])
		// The swap fails once the watch ended the turn.
		if !p.handling.CompareAndSwap(h|1, h) {
			return true
		}
	}
}

// handleEvent handles the connection ev is for, if it still is.
func (p *poller) handleEvent(ev syscall.EpollEvent) {
	if c := p.claim(ev.Fd, uint32(ev.Pad)); c != nil {
		p.handle(c)
	}
}

// watchRest is how many looks in a row that find no handle begun since
// the one before send the watch to wait for the next (see wakeWatch), so
// that an idle server does not wake every watchEvery.
const watchRest = 20

// watch ends the turn of a worker that it finds in the same handle on two
// looks in a row (see watchEvery), until stop.
func (p *poller) watch() {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	last, quiet := p.handling.Load(), 0
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		h := p.handling.Load()
		if h&3 == 1 && h == last && p.handling.CompareAndSwap(h, h|2) {
			p.taken.Add(1)
			p.token <- struct{}{}
		}
		if h != last || h&3 == 1 {
			last, quiet = h, 0
			continue
		}
		if quiet++; quiet < watchRest {
			continue
		}
		// Idle: wait for a handle. One that began before watchIdle was
		// set did not see it: look again after setting it.
		quiet = 0
		p.watchIdle.Store(true)
		if p.handling.Load() == h {
			t.Stop()
			select {
			case <-p.stop:
				return
			case <-p.watchWake:
			}
			t.Reset(watchEvery)
		}
		p.watchIdle.Store(false)
		last = p.handling.Load()
	}
}

// wakeWatch wakes the watch if it waits for a handle; called once the
// handle's number is stored.
func (p *poller) wakeWatch() {
	if p.watchIdle.Load() && p.watchIdle.CompareAndSwap(true, false) {
		select {
		case p.watchWake <- struct{}{}:
		default:
		}
	}
}

// next takes the events ready, up to len(evs), waiting for one if none
// is and work is empty: n of them (0: none, and work holds events), and
// whether it had to wait.
func (p *poller) next(evs []syscall.EpollEvent) (n int, waited bool, err error) {
	asked := 0
	err = p.rc.Read(func(fd uintptr) bool {
		asked++
		for {
			var werr error
			n, werr = syscall.EpollWait(int(fd), evs, 0)
			if werr == syscall.EINTR {
				continue
			}
			if n > 0 {
				return true
			}
			n = 0
			return len(p.work) > 0 // else park until the set is readable
		}
	})
	return n, asked > 1, err
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

// dispatch has an owned connection handled without waiting for an event
// (frames that came with the handshake, an end requested, a deadline
// passed), on a goroutine of its own: the workers are for the set.
func (p *poller) dispatch(c *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		go p.handle(c)
		return
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
	if c.ended {
		// shutdown ended it meanwhile (a dispatch racing Run's end).
		c.busy = false
		c.mu.Unlock()
		return
	}
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
	if !end || c.ended {
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
	var left []*Conn
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
