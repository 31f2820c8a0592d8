// Package tcpproxy forwards TCP connections from a loopback port to a
// target address and breaks them on demand, for fault tests and the
// benchmark: Cut closes the connections as a crashed peer would, and
// Blackhole makes them hang as a network partition does. It logs nothing.
package tcpproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// mode is what the proxy does with traffic.
type mode int32

const (
	forwarding mode = iota
	cut             // every connection closed, new ones closed on accept
	blackholed      // connections accepted, every byte dropped
)

// dialTimeout bounds the dial to the target, so that a target that does
// not answer fails the client's connection instead of holding it open.
const dialTimeout = 5 * time.Second

// Proxy is a running proxy. Its methods may be called from any goroutine.
type Proxy struct {
	target string
	ln     net.Listener
	// ctx is cancelled by Close, to end dials to the target.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts the accept loop and one goroutine per connection, each of
	// which waits for the second goroutine it starts.
	wg sync.WaitGroup

	// mode is written under mu, so that switching it and closing links
	// are one step for add; the copy loops read it without mu.
	mode   atomic.Int32
	mu     sync.Mutex
	links  map[*link]struct{}
	closed bool
}

// Start listens on a free port of 127.0.0.1 and forwards each connection
// to target, dialled when the connection is accepted.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy to %s: %w", target, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target: target,
		ln:     ln,
		ctx:    ctx,
		cancel: cancel,
		links:  make(map[*link]struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port, for clients to dial instead of the
// target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection, both sides, and closes new ones as soon
// as they are accepted, until Restore.
func (p *Proxy) Cut() { p.set(cut) }

// Blackhole drops every byte in both directions, on open connections and
// on new ones, which are accepted but never reach the target, until
// Restore. A client's writes succeed and its reads hang. Bytes already
// read when Blackhole is called may still be delivered.
func (p *Proxy) Blackhole() { p.set(blackholed) }

// Restore forwards new connections again. Connections open while
// blackholed are closed, as bytes were lost on them.
func (p *Proxy) Restore() { p.set(forwarding) }

func (p *Proxy) set(m mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := mode(p.mode.Swap(int32(m)))
	if m == cut || m == forwarding && old == blackholed {
		p.closeLinks()
	}
}

// Close stops accepting, closes every connection, and returns once every
// goroutine the proxy started has exited.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.closeLinks()
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Such as too many open files: wait for some to close
			// rather than spin.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(c)
		}()
	}
}

// closeLinks closes every open connection. The caller holds mu.
func (p *Proxy) closeLinks() {
	for l := range p.links {
		l.close()
		delete(p.links, l)
	}
}
