package tcpproxy

import "net"

// bufSize is each direction's copy buffer: small, as the benchmark may
// pass thousands of connections through one proxy.
const bufSize = 16 << 10

// link is one client connection and, unless it was accepted while
// blackholed, its connection to the target.
type link struct {
	client   net.Conn
	upstream net.Conn // nil when accepted while blackholed
}

func (l *link) close() {
	l.client.Close()
	if l.upstream != nil {
		l.upstream.Close()
	}
}

// serve owns client: it dials the target, copies both ways until either
// side or the proxy closes the link, and waits for its second copy loop.
func (p *Proxy) serve(client net.Conn) {
	l := &link{client: client}
	// While blackholed nothing would reach the target, so nothing dials it.
	if mode(p.mode.Load()) != blackholed {
		d := net.Dialer{Timeout: dialTimeout}
		up, err := d.DialContext(p.ctx, "tcp", p.target)
		if err != nil {
			client.Close()
			return
		}
		l.upstream = up
	}
	if !p.add(l) {
		l.close()
		return
	}
	defer p.remove(l)
	if l.upstream == nil {
		p.pipe(nil, client)
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.pipe(l.upstream, client)
		l.close()
	}()
	p.pipe(client, l.upstream)
	l.close()
	<-done
}

// add registers l, so that Cut, Restore and Close can close it, unless
// the mode changed while it was being set up such that it must not run:
// the proxy is cut or closed, or a link with no target was accepted
// while blackholed and the blackhole has ended since.
func (p *Proxy) add(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := mode(p.mode.Load())
	if p.closed || m == cut || l.upstream == nil && m != blackholed {
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *Proxy) remove(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.links, l)
}

// pipe copies src to dst until either fails, dropping what it reads while
// blackholed. A nil dst drops everything.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, bufSize)
	for {
		n, err := src.Read(buf)
		if n > 0 && dst != nil && mode(p.mode.Load()) != blackholed {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
