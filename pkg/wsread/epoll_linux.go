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

	"golang.org/x/sys/unix"
)

const epollSupported = true

// armEvents: readable or hung up, one event until re-armed, so one worker
// at a time owns a connection.
const armEvents = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT

// poller is the epoll mode's engine: the epoll set, the table of
// registered connections, the resident workers and the buffers.
//
// The workers take turns at the set: the one whose turn it is waits for
// it in the runtime's netpoller and reads the connection it takes itself,
// then waits again (see worker). A ping is read and handled on the
// goroutine that took its event, with no hand-off to another goroutine
// between and no other goroutine woken: a hand-off queued the handling
// behind whatever else the scheduler had, such as a renewal flush whose
// timer fell due in the same moment, which then went without the renewal
// that ping asked for, and waking the next worker for every event cost
// as much.
type poller struct {
	s    *Server
	file *os.File // the epoll fd, non-blocking, waited on in the runtime's netpoller
	// rc is file's; epoll_ctl goes through its Control, so the epfd number
	// is never used once file is closed (it may name another file by then).
	rc syscall.RawConn
	// turn is held by the worker whose turn it is at the set; the others
	// wait for it. It is handed on by whoever ends the turn: the worker,
	// or the watch, for a worker in a slow handler (a Mutex may be
	// unlocked by another goroutine than the one that locked it).
	turn sync.Mutex
	// handling is the turn's handler state, for the watch: a number each
	// handle gets (<<2), |1 while the turn's worker is in it, |2 once the
	// watch ended the turn (see worker).
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
		watchWake: make(chan struct{}, 1),
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

// worker takes its turn at the set, until the set is closed, and handles
// one event a turn. While the set is quiet it keeps the turn: it waits for
// an event, handles it and waits again, and no other worker is woken. The
// set is busy when the event was ready without a wait, or others are
// ready behind it: then it hands the turn on before it handles its event,
// and the next worker takes the next event in the set's order. The watch
// ends the turn for it when a handler is slow.
func (p *poller) worker() {
	for {
		p.turn.Lock()
		for held := true; held; {
			ev, quiet, err := p.next()
			if err != nil {
				p.turn.Unlock()
				return // closed
			}
			var h uint64
			if !quiet {
				p.turn.Unlock()
				held = false
			} else {
				h = p.handles.Add(1) << 2
				p.handling.Store(h | 1)
				p.wakeWatch()
			}
			if c := p.claim(ev.Fd, uint32(ev.Pad)); c != nil {
				p.handle(c)
			}
			// The swap fails once the watch ended the turn.
			if held && !p.handling.CompareAndSwap(h|1, h) {
				held = false
			}
		}
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
			p.turn.Unlock()
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

// next takes the event that became ready first, waiting for one if none
// is. quiet says the set was: it had to wait, and holds no other event
// now. Others are left in the set, in their order, for the next worker:
// one taken and handed to another goroutine would wait for a goroutine to
// run, and one put back (re-armed) would go behind every event that came
// meanwhile, again and again while other connections stream.
func (p *poller) next() (ev syscall.EpollEvent, quiet bool, err error) {
	var evs [1]syscall.EpollEvent
	asked := 0
	err = p.rc.Read(func(fd uintptr) bool {
		asked++
		for {
			n, err := syscall.EpollWait(int(fd), evs[:], 0)
			if err == syscall.EINTR {
				continue
			}
			if n <= 0 {
				return false // empty: park until the set is readable
			}
			quiet = asked > 1 && !holdsEvents(int(fd))
			return true
		}
	})
	return evs[0], quiet, err
}

// holdsEvents says whether the epoll set epfd has events ready, without
// taking any: an epoll fd polls readable while it does. Unsure (an error)
// counts as yes.
func holdsEvents(epfd int) bool {
	fds := []unix.PollFd{{Fd: int32(epfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n > 0
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
