package gateway

import (
	"errors"
	"io"
	"math"
	"net"
	"time"

	"github.com/gorilla/websocket"
)

// Reading a connection is shaped as the handler an event loop calls, so
// that the loop can take over from a goroutine per connection without the
// connection's code changing. The contract, which conn keeps (conn.go):
//
//   - Message(typ, data) gets one whole data message. Calls for one
//     connection never overlap, and come in order; on an event loop they
//     run on a worker every connection shares, and must not block.
//     Returning false stops reading: the connection lingers, if Linger
//     was called, and then Closed(nil) follows.
//   - Closed(err) is called exactly once, when reading has ended, and
//     must not block either. err is a *websocket.CloseError (the peer's
//     close, which gorilla/websocket answered), websocket.ErrReadLimit
//     (gorilla sent 1009, and the reader lingered), errIdle (the read
//     deadline passed), an error of a closed socket (net.ErrClosed:
//     someone closed it), any other read error, or nil after Message
//     returned false.
//   - Linger(d), asked from Message before it returns false: reading goes
//     on, dropping input, until the peer hangs up or d has passed.
//
// Control frames are gorilla's: it answers pings and closes, and hands
// pongs to the connection's pong handler, during a read. The read
// deadline is the socket's, set through the gorilla connection.

// msgHandler is what a reader drives: conn, and the tests' recorders.
type msgHandler interface {
	Message(typ int, data []byte) bool
	Closed(err error)
}

// errIdle is Closed's reason when the read deadline passed.
var errIdle = errors.New("read deadline passed")

// goReader reads one connection on a goroutine of its own (run). Its
// state is kept in the connection it reads: 4 bytes.
type goReader struct {
	lingerMS int32 // asked by Linger; run's own
}

// Linger asks run to linger for d (at most 24 days, to the ms) once
// Message returns false. Called from Message, on run's goroutine.
func (r *goReader) Linger(d time.Duration) {
	r.lingerMS = int32(min(d.Milliseconds(), math.MaxInt32))
}

// run reads ws until it ends, handing each message to h, then tells h.
func (r *goReader) run(ws *websocket.Conn, h msgHandler) {
	for {
		typ, data, err := ws.ReadMessage()
		if err != nil {
			switch {
			case errors.Is(err, websocket.ErrReadLimit):
				lingerOn(ws.NetConn(), lingerTimeout)
			case isTimeout(err):
				err = errIdle
			}
			h.Closed(err)
			return
		}
		if !h.Message(typ, data) {
			if r.lingerMS > 0 {
				lingerOn(ws.NetConn(), time.Duration(r.lingerMS)*time.Millisecond)
			}
			h.Closed(nil)
			return
		}
	}
}

// isTimeout reports whether a read failed at its deadline. gorilla hides
// the net error behind one of its own, which says so.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// lingerOn reads nc and drops what comes until the peer hangs up or d has
// passed: closing a socket with unread input would reset the connection,
// and the peer could lose the close frame sent before.
func lingerOn(nc net.Conn, d time.Duration) {
	nc.SetReadDeadline(time.Now().Add(d))
	io.Copy(io.Discard, nc)
}
