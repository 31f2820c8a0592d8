// Package wsread reads gorilla/websocket connections without a goroutine
// parked per idle connection.
//
// gorilla/websocket keeps the whole protocol: validation, control frames,
// the close handshake, the read limit, writes. In the epoll mode (Linux)
// wsread sits below it: the net.Conn gorilla reads from is wsread's own
// wrapper. Resident workers take turns waiting on an epoll set in the
// runtime's netpoller; the one that takes a readable socket (the others
// a busy set held at the time go to the other workers) reads what the
// socket holds without waiting, finds the longest prefix made of whole
// messages and whole control frames outside a message (scan.go), shows
// gorilla only that prefix and calls ReadMessage as many times as it
// holds messages. gorilla therefore never asks for a byte that is not
// there and its read buffer is empty whenever the connection goes back
// to epoll. Writes pass through to the socket and block, with their
// deadlines, on whichever goroutine writes.
//
// Read deadlines become state: SetReadDeadline on the wrapper records the
// time, and a sweep ends connections past it (Handler.Closed(ErrIdle)).
//
// The goroutine mode is the classic design (one goroutine per connection
// running ReadMessage) behind the same API, for other platforms and for
// connections without a file descriptor (TLS).
//
// gorilla's read buffer only ever holds part of a batch in the epoll mode.
// For a connection Upgrade made, it is the connection's own reader, which
// borrows a worker's buffer for each batch and gives it back empty: an
// idle connection holds no read buffer, and Upgrader.ReadBufferSize only
// sizes that of a connection read by a goroutine (at least 257 bytes,
// the least gorilla keeps of a hijacked reader).
//
// Settings the caller owns: Dialer.ReadBufferSize can be 128 in the epoll
// mode (gorilla's floor is 125, a control frame). Keep WriteBufferPool
// set, so idle connections hold no write buffer. Serve sets gorilla's read
// limit to Config.ReadLimit: do not change it afterwards, the scan must
// agree with gorilla on it.
package wsread
