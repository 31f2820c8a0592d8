package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
)

// leanServer is the platform's webhook receiver as the bench runs it:
// HTTP/1.1 with keep-alive, bodies of a Content-Length, answered with a
// status and no body, and nothing else. The platform's receiver runs on
// its own machines; here it shares this machine's cores with every part
// the bench measures, and net/http's server cost a fifth of this
// process's CPU in the storm's release (a profile of it), more than any
// part of stillthere but the consumer. A request it does not read (no
// Content-Length, a chunked body, a malformed head) is answered 400 and
// its connection closed: the consumer's sender never sends one.
type leanServer struct {
	ln     net.Listener
	handle func(body []byte) int // the status to answer

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// maxLeanBody bounds a body: a guide is a few hundred bytes.
const maxLeanBody = 1 << 20

// serveLean answers the requests of every connection ln accepts with
// handle, until Close.
func serveLean(ln net.Listener, handle func(body []byte) int) *leanServer {
	s := &leanServer{ln: ln, handle: handle, conns: map[net.Conn]struct{}{}}
	s.wg.Go(s.accept)
	return s
}

func (s *leanServer) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Go(func() { s.serve(c) })
		s.mu.Unlock()
	}
}

// Close stops accepting, closes every connection and waits for their
// goroutines.
func (s *leanServer) Close() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.ln.Close()
	s.wg.Wait()
}

func (s *leanServer) serve(c net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReaderSize(c, 8<<10)
	w := bufio.NewWriterSize(c, 512)
	var body []byte
	for {
		n, keep, err := readLeanHead(r)
		if errors.Is(err, io.EOF) {
			return // the client closed between requests
		}
		status := 400
		if err == nil {
			if cap(body) < n {
				body = make([]byte, n)
			}
			body = body[:n]
			if _, err = io.ReadFull(r, body); err != nil {
				return
			}
			status = s.handle(body)
		} else {
			keep = false
		}
		fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\n", status, statusText(status))
		if !keep {
			w.WriteString("Connection: close\r\n")
		}
		w.WriteString("\r\n")
		if w.Flush() != nil || !keep {
			return
		}
	}
}

func statusText(code int) string {
	if code == 200 {
		return "OK"
	}
	return "Status"
}

// readLeanHead reads a request's line and headers: the body's length,
// and whether the connection stays open after it. io.EOF: the
// connection ended before a request began.
func readLeanHead(r *bufio.Reader) (n int, keep bool, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		if len(line) == 0 && errors.Is(err, io.EOF) {
			return 0, false, io.EOF
		}
		return 0, false, fmt.Errorf("request line: %w", err)
	}
	_, rest, ok := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(" "))
	if !ok {
		return 0, false, fmt.Errorf("request line %q", line)
	}
	_, proto, ok := bytes.Cut(rest, []byte(" "))
	if !ok {
		return 0, false, fmt.Errorf("request line %q", line)
	}
	keep = string(proto) == "HTTP/1.1"
	n = -1
	for {
		h, err := r.ReadSlice('\n')
		if err != nil {
			return 0, false, fmt.Errorf("header: %w", err)
		}
		h = bytes.TrimRight(h, "\r\n")
		if len(h) == 0 {
			break
		}
		k, v, ok := bytes.Cut(h, []byte(":"))
		if !ok {
			return 0, false, fmt.Errorf("header %q", h)
		}
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, []byte("Content-Length")):
			if n, err = strconv.Atoi(string(v)); err != nil || n < 0 || n > maxLeanBody {
				return 0, false, fmt.Errorf("content length %q", v)
			}
		case bytes.EqualFold(k, []byte("Transfer-Encoding")):
			return 0, false, fmt.Errorf("transfer encoding %q: not read here", v)
		case bytes.EqualFold(k, []byte("Connection")):
			keep = !bytes.EqualFold(v, []byte("close"))
		}
	}
	if n < 0 {
		return 0, false, errors.New("no content length")
	}
	return n, keep, nil
}
