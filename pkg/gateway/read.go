package gateway

import (
	"github.com/stillthere/stillthere/pkg/wsread"
)

// Client connections are read by a wsread.Server, in the read mode the
// config names. In epoll mode (Linux's default) no goroutine waits on an
// idle connection: one epoll set tells when a socket has input, and a few
// resident workers read it and hand gorilla/websocket whole frames only.
// In goroutine mode each connection has a reader goroutine of its own.
// conn is the same in both, the handler the server calls:
//
//   - Message(typ, data) gets one whole data message. Calls for one
//     connection never overlap, and come in order; in epoll mode they run
//     on a worker every connection shares, so nothing in them waits: a
//     renewal is answered from the renewer's goroutine (see renew), and
//     what writes Redis at a connection's end runs on its own.
//     Returning false stops reading: the connection lingers, if Linger
//     was called, and then Closed(nil) follows.
//   - Closed(err) is called exactly once, when reading has ended, and
//     must not block either. err is a *websocket.CloseError (the peer's
//     close, which gorilla answered, or 1006 for a hang-up),
//     websocket.ErrReadLimit (gorilla sent 1009, and the reader
//     lingered), wsread.ErrIdle (the read deadline passed), net.ErrClosed
//     (the gateway closed it: a slow client, a failed ping, the drain's
//     cut-off), any other read error, or nil after Message returned
//     false.
//
// Control frames are gorilla's: it answers pings and closes, and hands
// pongs to the connection's pong handler, during a read. Read deadlines
// are set through the gorilla connection as before; in epoll mode the
// server records them, and its sweep ends a connection past its own, up
// to a sweep interval late.

// newReader is the server that reads the gateway's client connections.
func newReader(cfg Config) (*wsread.Server, error) {
	mode, err := wsread.ParseMode(cfg.ReadMode)
	if err != nil {
		return nil, err
	}
	return wsread.New(wsread.Config{Mode: mode, ReadLimit: int64(cfg.ReadLimit)})
}

// readBufferSize is gorilla's read buffer for a connection read in mode.
// In epoll mode gorilla reads batches of whole frames through a buffer
// wsread lends it per batch, and the size only counts for a connection
// without a file descriptor (which wsread reads with at least 257 bytes);
// a goroutine reads through it from the socket, where it sizes syscalls.
func readBufferSize(mode string) int {
	if mode == string(wsread.ModeEpoll) {
		return 128
	}
	return 512
}
