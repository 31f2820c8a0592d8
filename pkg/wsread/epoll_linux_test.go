//go:build linux

package wsread

import "testing"

// TestGeneration: an event carrying an old generation (the fd was closed
// and reused) is dropped.
func TestGeneration(t *testing.T) {
	if !epollSupported {
		t.Skip("epoll mode only")
	}
	ts := startServer(t, Config{Mode: ModeEpoll}, nil)
	dialRaw(t, ts.url, nil)
	rec := ts.next(t)
	c := rec.c
	waitFor(t, "registration", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.registered })
	if got := ts.s.p.claim(c.fd, c.gen+1); got != nil {
		t.Fatal("claimed a connection for another generation")
	}
	if got := ts.s.p.claim(c.fd, c.gen); got != c {
		t.Fatal("did not claim the connection for its generation")
	}
	c.mu.Lock()
	c.busy = false
	c.mu.Unlock()
}
