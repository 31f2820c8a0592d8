package guide

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"time"
)

// syncTransport is the consumer's HTTP/1.1 transport: each request is
// written and its response read on the caller's goroutine, over a pool of
// keep-alive connections per host. net/http's Transport hands every
// request to two goroutines of its connection (a writer and a reader),
// through channels both ways: in a storm of guides that was a third of
// the consumer's CPU, and this takes a third less (detectbench's storm).
// Requests and responses are still net/http's own (Request.Write,
// http.ReadResponse); a request a proxy would carry goes through
// fallback, the standard transport.
//
// Each request is bounded by timeout as a whole (dial, TLS, write, the
// answer's head and body), and by its context; an answer's head by
// maxHead. A keep-alive connection is used again only if nothing came on
// it unasked and, where the system allows, the server has not closed it
// (alive); one the server closes under a request, before any byte of an
// answer, gets the request again once, on a new connection, if it may be
// sent again (replayable), as net/http does. Idle connections close after
// idleFor.
type syncTransport struct {
	timeout  time.Duration
	maxIdle  int // per host
	idleFor  time.Duration
	tls      *tls.Config // nil: the system's roots
	proxy    func(*http.Request) (*url.URL, error)
	fallback http.RoundTripper

	mu    sync.Mutex
	idle  map[string][]*syncConn // by scheme and address, the oldest first
	prune *time.Timer            // closes those idle for idleFor; nil while none is idle
}

// syncConn is one keep-alive connection.
type syncConn struct {
	c     net.Conn
	raw   net.Conn // the TCP connection under c (c itself without TLS), for connAlive
	in    *countingReader
	br    *bufio.Reader
	bw    *bufio.Writer
	since time.Time // idle since
}

// maxHead bounds the heads of one answer, informational ones included, as
// net/http's default (Transport.MaxResponseHeaderBytes); maxInformational
// bounds the informational answers before the final one, as net/http's.
const (
	maxHead          = 10 << 20
	maxInformational = 5
)

// errHeadTooLarge fails an answer whose head is past maxHead.
var errHeadTooLarge = errors.New("http: answer's head larger than 10 MiB")

func newSyncTransport(timeout time.Duration, maxIdle int) *syncTransport {
	return &syncTransport{
		timeout: timeout,
		maxIdle: maxIdle,
		idleFor: 90 * time.Second,
		proxy:   http.ProxyFromEnvironment,
		fallback: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			MaxIdleConnsPerHost: maxIdle,
			IdleConnTimeout:     90 * time.Second,
		},
	}
}

// RoundTrip sends req and reads the head of its answer; the body is read
// from the connection as the caller reads it, and the connection goes
// back to the pool once the body is read to its end and closed.
func (t *syncTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(req.Context(), t.timeout)
	if p, err := t.proxy(req); err != nil || p != nil || (req.URL.Scheme != "http" && req.URL.Scheme != "https") {
		resp, err := t.fallback.RoundTrip(req.WithContext(ctx))
		if err != nil {
			cancel()
			return nil, err
		}
		resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
		return resp, nil
	}
	key := req.URL.Scheme + "://" + canonicalAddr(req.URL)
	var first error  // the kept connection's failure, when the request goes again
	written := false // req's body closed: Request.Write closes it, however it ends
	fail := func(err error) (*http.Response, error) {
		cancel()
		if !written && req.Body != nil {
			req.Body.Close() // a RoundTripper closes it, as net/http does: its writer may wait on it
		}
		return nil, again(first, err)
	}
	for {
		var sc *syncConn
		reused := false
		if first == nil {
			sc, reused = t.get(key)
		}
		if sc == nil {
			var err error
			if sc, err = t.dial(ctx, req.URL); err != nil {
				return fail(err)
			}
		}
		read := sc.in.n
		written = true
		resp, stop, err := t.exchange(ctx, sc, req, first != nil)
		if err == nil {
			resp.Body = &syncBody{body: resp.Body, t: t, key: key, sc: sc, keep: !resp.Close && !req.Close, ctx: ctx,
				stop: stop, cancel: cancel}
			return resp, nil
		}
		sc.c.Close()
		if ctx.Err() != nil && req.Context().Err() != nil {
			err = req.Context().Err()
		}
		// Closed by the server before any byte of an answer: it had
		// closed the connection as idle as the request came (or died
		// with it, which an idempotency key makes safe to send again).
		if !reused || sc.in.n != read || !closedIdle(err) || !replayable(req) {
			return fail(err)
		}
		first = err
	}
}

// again is the error of a request sent again after its kept connection
// failed with first: first's, which says the request may have reached
// the server (the consumer counts such a guide as maybe shown), with
// what became of the second sending (a refused dial, say, which alone
// would say it never left).
func again(first, err error) error {
	if first == nil {
		return err
	}
	return fmt.Errorf("%w; sent again on a new connection: %v", first, err)
}

// exchange writes req on sc and reads its answer's head, skipping
// informational answers (1xx but 101). On success, stop ends the
// context's hold on the connection's deadline, once the body is done.
func (t *syncTransport) exchange(ctx context.Context, sc *syncConn, req *http.Request, again bool) (_ *http.Response, stop func() bool, err error) {
	if dl, ok := ctx.Deadline(); ok {
		sc.c.SetDeadline(dl)
	}
	release := context.AfterFunc(ctx, func() { sc.c.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if err != nil {
			release()
		}
	}()
	r := req
	if again && req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, nil, err
		}
		r = req.Clone(ctx)
		r.Body = body
	}
	if err := r.Write(sc.bw); err != nil {
		return nil, nil, err
	}
	if err := sc.bw.Flush(); err != nil {
		return nil, nil, err
	}
	sc.in.limit = sc.in.n + int64(sc.br.Buffered()) + maxHead
	defer func() { sc.in.limit = 0 }()
	for range maxInformational + 1 {
		resp, err := http.ReadResponse(sc.br, req)
		if err != nil {
			return nil, nil, err
		}
		if resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == http.StatusSwitchingProtocols {
			if resp.StatusCode == http.StatusSwitchingProtocols {
				resp.Close = true // not ours to speak the protocol it switched to
			}
			return resp, release, nil
		}
		resp.Body.Close()
	}
	return nil, nil, fmt.Errorf("http: more than %d informational answers", maxInformational)
}

// dial opens a connection to u's host, with TLS for https.
func (t *syncTransport) dial(ctx context.Context, u *url.URL) (*syncConn, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", canonicalAddr(u))
	if err != nil {
		return nil, err
	}
	c := raw
	if u.Scheme == "https" {
		cfg := t.tls.Clone()
		if cfg == nil {
			cfg = &tls.Config{}
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		c = tc
	}
	in := &countingReader{r: c}
	return &syncConn{c: c, raw: raw, in: in, br: bufio.NewReaderSize(in, 4<<10), bw: bufio.NewWriterSize(c, 4<<10)}, nil
}

// countingReader counts the bytes read from a connection (whether an
// answer began to arrive), and fails a read past limit (the answer's
// head too large) when limit is set.
type countingReader struct {
	r     io.Reader
	n     int64
	limit int64 // 0: none
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.limit > 0 {
		if c.n >= c.limit {
			return 0, errHeadTooLarge
		}
		p = p[:min(int64(len(p)), c.limit-c.n)]
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// get takes the most recently used idle connection to key that is
// still good (alive), if any: reused says it was one.
func (t *syncTransport) get(key string) (sc *syncConn, reused bool) {
	for {
		t.mu.Lock()
		l := t.idle[key]
		if len(l) == 0 {
			t.mu.Unlock()
			return nil, false
		}
		sc = l[len(l)-1]
		l[len(l)-1] = nil
		t.idle[key] = l[:len(l)-1]
		t.mu.Unlock()
		if time.Since(sc.since) < t.idleFor && alive(sc) {
			return sc, true
		}
		sc.c.Close()
	}
}

// alive says whether an idle connection may carry a request: nothing
// came on it unasked (an answer nobody asked for would be read as the
// next request's), and, where the system tells, the server has not
// closed it. Over TLS, what came may sit in the TLS layer's own buffer,
// out of the socket's sight: a read whose deadline has passed takes in
// what it holds, and no more, without waiting. Anything on the socket
// itself, a TLS message after the handshake (a session ticket) too,
// makes a connection not used again: a new one costs a handshake, a
// wrong one a guide.
func alive(sc *syncConn) bool {
	if sc.br.Buffered() > 0 {
		return false
	}
	if sc.raw != sc.c {
		sc.c.SetReadDeadline(time.Unix(1, 0))
		_, err := sc.br.Peek(1)
		// The look below is a read too, which a passed deadline refuses.
		sc.c.SetReadDeadline(time.Time{})
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return false
		}
	}
	return connAlive(sc.raw)
}

// put keeps sc for the next request to key, or closes it when key has
// maxIdle already.
func (t *syncTransport) put(key string, sc *syncConn) {
	sc.c.SetDeadline(time.Time{})
	sc.since = time.Now()
	t.mu.Lock()
	if t.idle == nil {
		t.idle = map[string][]*syncConn{}
	}
	if len(t.idle[key]) < t.maxIdle {
		t.idle[key] = append(t.idle[key], sc)
		sc = nil
		if t.prune == nil {
			t.prune = time.AfterFunc(t.idleFor, t.pruneIdle)
		}
	}
	t.mu.Unlock()
	if sc != nil {
		sc.c.Close()
	}
}

// pruneIdle closes the connections idle for idleFor, and comes again
// when the oldest left will be: after a burst the pool shrinks back,
// request or not.
func (t *syncTransport) pruneIdle() {
	var closing []*syncConn
	t.mu.Lock()
	now := time.Now()
	var oldest time.Time
	for key, l := range t.idle {
		n := 0
		for n < len(l) && now.Sub(l[n].since) >= t.idleFor {
			n++
		}
		closing = append(closing, l[:n]...)
		l = append(l[:0], l[n:]...)
		clear(t.idle[key][len(l):])
		t.idle[key] = l
		if len(l) > 0 && (oldest.IsZero() || l[0].since.Before(oldest)) {
			oldest = l[0].since
		}
	}
	t.prune = nil
	if !oldest.IsZero() {
		t.prune = time.AfterFunc(oldest.Add(t.idleFor).Sub(now), t.pruneIdle)
	}
	t.mu.Unlock()
	for _, sc := range closing {
		sc.c.Close()
	}
}

// CloseIdleConnections closes the idle connections.
func (t *syncTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	if t.prune != nil {
		t.prune.Stop()
		t.prune = nil
	}
	t.mu.Unlock()
	for _, l := range idle {
		for _, sc := range l {
			sc.c.Close()
		}
	}
	if c, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// syncBody is a response's body: read to its end and closed, its
// connection goes back to the pool; closed before its end, or of an
// answer that closes the connection, the connection is closed.
type syncBody struct {
	body   io.ReadCloser
	t      *syncTransport
	key    string
	sc     *syncConn
	keep   bool
	eof    bool
	closed bool
	ctx    context.Context // the request's, with its timeout
	stop   func() bool     // ends ctx's hold on the connection's deadline
	cancel context.CancelFunc
}

func (b *syncBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, errors.New("http: read on closed response body")
	}
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *syncBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	if !b.eof {
		// The rest of the answer is not ours to wait for: net/http's
		// body reads a delimited answer to its end on Close, while the
		// request's deadline stands.
		b.sc.c.Close()
	}
	b.body.Close()
	// Not once the request's context ended: the connection's deadline
	// may have passed in a read.
	b.stop()
	live := b.eof && b.keep && b.ctx.Err() == nil
	b.cancel()
	if live {
		b.t.put(b.key, b.sc)
	} else {
		b.sc.c.Close()
	}
	return nil
}

// cancelBody ends a fallback request's context with its body.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// canonicalAddr is u's host and port, the scheme's port when it has none.
func canonicalAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// closedIdle says whether err is what a keep-alive connection the server
// had closed gives a request sent on it, before any byte of an answer:
// its write refused, or its read at the connection's end
// (http.ReadResponse says io.ErrUnexpectedEOF for an end before any
// byte too).
func closedIdle(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE)
}

// replayable says whether req may be sent again after a connection closed
// under it, as net/http decides: a body it can send again, and a method
// that is idempotent or an idempotency key (every guide has one).
func replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}
