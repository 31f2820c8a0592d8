package wsread

import (
	"errors"
	"io"
	"net"
	"os"
	"time"

	"github.com/gorilla/websocket"
)

// serveGoroutine reads c on a goroutine of its own: the classic design.
func (s *Server) serveGoroutine(c *Conn) {
	s.gmu.Lock()
	defer s.gmu.Unlock()
	if s.gdone {
		c.ws.UnderlyingConn().Close()
		s.gwg.Go(func() { c.h.Closed(net.ErrClosed) })
		return
	}
	s.gconns[c] = struct{}{}
	s.gwg.Go(func() {
		err := c.readLoop(s.cfg.Linger)
		s.gmu.Lock()
		delete(s.gconns, c)
		s.gmu.Unlock()
		c.h.Closed(err)
	})
}

// endGoroutines closes the connections read by goroutines and waits for
// their readers (Closed(net.ErrClosed) each).
func (s *Server) endGoroutines() {
	s.gmu.Lock()
	s.gdone = true
	for c := range s.gconns {
		c.ws.UnderlyingConn().Close()
	}
	s.gmu.Unlock()
	s.gwg.Wait()
}

// readLoop runs ReadMessage until reading ends, and says why in the terms
// of Handler.Closed.
func (c *Conn) readLoop(linger time.Duration) error {
	for {
		typ, data, err := c.ws.ReadMessage()
		if err != nil {
			return c.readEnd(err, linger)
		}
		if c.lingering() {
			c.drain()
			return nil
		}
		ok, err := c.message(typ, data)
		if err != nil {
			return err
		}
		if c.lingering() {
			c.drain()
			return nil
		}
		if !ok {
			return nil
		}
	}
}

// drain drops input below gorilla until the peer hangs up or the linger
// passes. Lingering through ReadMessage would run gorilla's pong handler,
// and one that pushes the read deadline out (as keep-alive handlers do)
// would push the linger's end out with it.
func (c *Conn) drain() {
	nc := c.ws.UnderlyingConn()
	nc.SetReadDeadline(time.Unix(0, c.lingerUntil.Load()))
	io.Copy(io.Discard, nc)
}

func (c *Conn) readEnd(err error, linger time.Duration) error {
	switch {
	case c.lingering():
		return nil
	case errors.Is(err, net.ErrClosed):
		return net.ErrClosed
	case isTimeout(err):
		return ErrIdle
	case gorillaSentClose(err):
		// gorilla sent 1002 or 1009 and its reader is done: drop input
		// below it until the peer hangs up or linger passes.
		nc := c.ws.UnderlyingConn()
		nc.SetReadDeadline(time.Now().Add(linger))
		io.Copy(io.Discard, nc)
	}
	return err
}

// isTimeout: gorilla hides the deadline error behind its own net.Error.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// gorillaSentClose tells gorilla's own protocol errors (after which it
// sent a close frame) from read errors and the peer's close.
func gorillaSentClose(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, websocket.ErrReadLimit):
		return true
	case isCloseError(err), errors.As(err, &ne), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return false
	}
	return true
}
