//go:build unix

package guide

import (
	"errors"
	"net"
	"syscall"
)

// connAlive says whether an idle connection is still open: no end of
// stream, no error and nothing unasked waiting to be read. A server
// closes keep-alive connections it finds idle (Node's after 5 s), and a
// request sent on one fails; net/http's reader goroutine sees the close
// at once, and this looks before each reuse instead, without blocking: a
// peek of one byte, which the system answers at once.
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Nothing to read yet is an open, quiet connection; 0 bytes is
		// its end; a byte is an answer nobody asked for.
		alive = n < 0 && (errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK))
		return true
	})
	return err == nil && alive
}
