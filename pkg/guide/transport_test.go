package guide

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer is an httptest server that counts the connections its
// clients opened and the requests it took.
type countingServer struct {
	*httptest.Server
	conns, reqs atomic.Int64
	closed      atomic.Int64 // connections closed, by either side
}

func newCountingServer(t *testing.T, h http.HandlerFunc, configure ...func(*http.Server)) *countingServer {
	cs := &countingServer{}
	cs.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cs.reqs.Add(1)
		h(w, r)
	}))
	cs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			cs.conns.Add(1)
		case http.StateClosed, http.StateHijacked:
			cs.closed.Add(1)
		}
	}
	for _, c := range configure {
		c(cs.Config)
	}
	cs.Start()
	t.Cleanup(cs.Close)
	return cs
}

// post sends a guide-like POST through tr, reads the whole answer and
// closes it, as the senders do.
func post(t *testing.T, tr http.RoundTripper, ctx context.Context, u, id string) (int, string, error) {
	t.Helper()
	body := `{"id":"` + id + `"}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if id != "" {
		req.Header.Set("Idempotency-Key", id)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(got), err
}

// TestSyncTransportKeepsConnection: sequential requests share one
// connection; concurrent ones open no more than they need, and each gets
// its own answer.
func TestSyncTransportKeepsConnection(t *testing.T) {
	cs := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Echo", r.Header.Get("Idempotency-Key"))
		fmt.Fprintf(w, "took %s", b)
	})
	tr := newSyncTransport(5*time.Second, 8)
	defer tr.CloseIdleConnections()
	for i := range 20 {
		id := fmt.Sprint("g", i)
		code, body, err := post(t, tr, context.Background(), cs.URL+"/guide", id)
		if err != nil || code != 200 || body != `took {"id":"`+id+`"}` {
			t.Fatalf("request %d: %d %q %v", i, code, body, err)
		}
	}
	if n := cs.conns.Load(); n != 1 {
		t.Fatalf("20 requests one after another opened %d connections, want 1", n)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			id := fmt.Sprint("c", i)
			code, body, err := post(t, tr, context.Background(), cs.URL, id)
			if err != nil || code != 200 || body != `took {"id":"`+id+`"}` {
				errs <- fmt.Errorf("request %s: %d %q %v", id, code, body, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := cs.reqs.Load(); n != 84 {
		t.Fatalf("the server took %d requests, want 84: none lost, none sent twice", n)
	}
}

// TestSyncTransportServerClosedIdle: a keep-alive connection the server
// closed while it sat idle (its idle timeout) is not used: the next
// request goes on a new one, and reaches the server once, even one the
// transport could not send again.
func TestSyncTransportServerClosedIdle(t *testing.T) {
	cs := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") },
		func(s *http.Server) { s.IdleTimeout = 50 * time.Millisecond })
	tr := newSyncTransport(5*time.Second, 8)
	defer tr.CloseIdleConnections()
	if code, _, err := post(t, tr, context.Background(), cs.URL, "a"); err != nil || code != 200 {
		t.Fatalf("first request: %d %v", code, err)
	}
	waitFor(t, "the server to close the idle connection", func() bool { return cs.closed.Load() == 1 })
	// Without an idempotency key: the transport may not send it twice,
	// so it must not send it on the closed connection at all.
	if code, _, err := post(t, tr, context.Background(), cs.URL, ""); err != nil || code != 200 {
		t.Fatalf("a request after the server closed the idle connection: %d %v; want it sent on a new one", code, err)
	}
	if c, r := cs.conns.Load(), cs.reqs.Load(); c != 2 || r != 2 {
		t.Fatalf("%d connections, %d requests; want 2 and 2", c, r)
	}
}

// rawServer accepts connections and runs serve on each, for answers
// net/http's server would not give.
func rawServer(t *testing.T, serve func(n int, c net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(n, c)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// readRequest reads one request from br, body included.
func readRequest(br *bufio.Reader) (*http.Request, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, req.Body)
	return req, err
}

// TestSyncTransportClosedUnderRequest: a server that closes a reused
// connection on a request's arrival, answering nothing (it had timed it
// out as the request came), gets the request again on a new connection
// when it carries an idempotency key, as net/http does; without one the
// request fails, never sent twice by the transport.
func TestSyncTransportClosedUnderRequest(t *testing.T) {
	for _, keyed := range []bool{true, false} {
		t.Run(fmt.Sprint("keyed=", keyed), func(t *testing.T) {
			var mu sync.Mutex
			var seen []string // request ids, by arrival
			u := rawServer(t, func(n int, c net.Conn) {
				br := bufio.NewReader(c)
				for i := 0; ; i++ {
					req, err := readRequest(br)
					if err != nil {
						return
					}
					mu.Lock()
					seen = append(seen, req.URL.Query().Get("id"))
					mu.Unlock()
					if n == 0 && i == 1 {
						return // the first connection's second request: closed, no answer
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			})
			tr := newSyncTransport(5*time.Second, 8)
			tr.idleFor = time.Hour
			defer tr.CloseIdleConnections()
			send := func(id string) error {
				req, _ := http.NewRequest(http.MethodPost, u+"/?id="+id, strings.NewReader("{}"))
				if keyed {
					req.Header.Set("Idempotency-Key", id)
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					return err
				}
				io.Copy(io.Discard, resp.Body)
				return resp.Body.Close()
			}
			if err := send("a"); err != nil {
				t.Fatal(err)
			}
			err := send("b")
			mu.Lock()
			got := strings.Join(seen, ",")
			mu.Unlock()
			if keyed && (err != nil || got != "a,b,b") {
				t.Fatalf("keyed: %v, the server saw %s; want it sent again on a new connection (a,b,b)", err, got)
			}
			if !keyed && (err == nil || got != "a,b") {
				t.Fatalf("without a key: %v, the server saw %s; want an error, and b sent once", err, got)
			}
		})
	}
}

// TestSyncTransportAnswers: answers the pool must not keep a connection
// after (one that closes it, a body left unread), informational answers
// before the real one, and a chunked body.
func TestSyncTransportAnswers(t *testing.T) {
	cases := []struct {
		name   string
		answer string
		read   bool // the caller reads the body to its end
		body   string
		kept   bool
	}{
		{"plain", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true, "ok", true},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", true, "ok", false},
		{"body unread", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false, "", false},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", true, "ok", true},
		{"informational first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\nok", true, "ok", true},
		{"no body", "HTTP/1.1 204 No Content\r\n\r\n", true, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var conns atomic.Int64
			u := rawServer(t, func(_ int, c net.Conn) {
				conns.Add(1)
				br := bufio.NewReader(c)
				for {
					if _, err := readRequest(br); err != nil {
						return
					}
					io.WriteString(c, tc.answer)
				}
			})
			tr := newSyncTransport(5*time.Second, 8)
			defer tr.CloseIdleConnections()
			for i := range 2 {
				req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader("{}"))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode < 200 {
					t.Fatalf("answer %d: status %d, want the final answer", i, resp.StatusCode)
				}
				if tc.read {
					b, err := io.ReadAll(resp.Body)
					if err != nil || string(b) != tc.body {
						t.Fatalf("answer %d: body %q %v, want %q", i, b, err, tc.body)
					}
				}
				resp.Body.Close()
			}
			want := int64(2)
			if tc.kept {
				want = 1
			}
			if n := conns.Load(); n != want {
				t.Fatalf("two requests opened %d connections, want %d", n, want)
			}
		})
	}
}

// TestSyncTransportTimeout: a server that never answers costs the
// transport's timeout, and the error is a timeout the consumer counts as
// a send that may have shown the guide; a connection refused is a dial
// error, which did not; a request whose context is cancelled fails with
// the cancellation at once.
func TestSyncTransportTimeout(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	accepted := make(chan struct{}, 8)
	u := rawServer(t, func(_ int, c net.Conn) {
		accepted <- struct{}{}
		<-hang
	})
	tr := newSyncTransport(200*time.Millisecond, 8)
	start := time.Now()
	_, _, err := post(t, tr, context.Background(), u, "slow")
	var ne net.Error
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a server that never answers: %v, want a timeout", err)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Fatalf("gave up after %v, before the timeout", took)
	}
	if !mayHaveShown(err) {
		t.Fatalf("a timed-out send: mayHaveShown false, want true (the request went out)")
	}

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := "http://" + ln.Addr().String()
	ln.Close()
	_, _, err = post(t, tr, context.Background(), closed, "refused")
	if err == nil || mayHaveShown(err) {
		t.Fatalf("a refused connection: %v, mayHaveShown %v; want a dial error that showed nothing", err, mayHaveShown(err))
	}

	ctx, cancel := context.WithCancel(context.Background())
	tr = newSyncTransport(time.Minute, 8)
	for len(accepted) > 0 {
		<-accepted // the timed-out request's connection
	}
	go func() { <-accepted; cancel() }() // once the request's connection is open: cancels it under way
	_, _, err = post(t, tr, ctx, u, "cancelled")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled request: %v, want context.Canceled", err)
	}
}

// TestSyncTransportTLS: https goes over TLS to the server's name, and
// keeps its connection too.
func TestSyncTransportTLS(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			t.Error("a request without TLS")
		}
		io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	tr := newSyncTransport(5*time.Second, 8)
	tr.tls = &tls.Config{RootCAs: roots}
	defer tr.CloseIdleConnections()
	for i := range 3 {
		if code, body, err := post(t, tr, context.Background(), srv.URL, fmt.Sprint(i)); err != nil || code != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q %v", i, code, body, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("3 requests over TLS opened %d connections, want 1", n)
	}
	tr.tls = nil // the system's roots: the test's certificate is not among them
	tr.CloseIdleConnections()
	if _, _, err := post(t, tr, context.Background(), srv.URL, "x"); err == nil {
		t.Fatal("a certificate of no known authority was accepted")
	}
}

// TestSyncTransportProxy: a request a proxy would carry goes through the
// standard transport.
func TestSyncTransportProxy(t *testing.T) {
	var proxied atomic.Int64
	tr := newSyncTransport(5*time.Second, 8)
	tr.proxy = func(*http.Request) (*url.URL, error) { return url.Parse("http://proxy.invalid:3128") }
	tr.fallback = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		proxied.Add(1)
		if _, ok := r.Context().Deadline(); !ok {
			t.Error("a proxied request without the transport's timeout")
		}
		return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("via proxy")), Request: r}, nil
	})
	code, body, err := post(t, tr, context.Background(), "http://127.0.0.1:9/", "p")
	if err != nil || code != 200 || body != "via proxy" || proxied.Load() != 1 {
		t.Fatalf("%d %q %v, %d through the fallback; want it through the fallback", code, body, err, proxied.Load())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestConnAlive: an open, quiet connection is alive; one whose peer
// closed it, or sent what nobody asked for, is not.
func TestConnAlive(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (client, server net.Conn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c, s
	}
	c, s := pair()
	if !connAlive(c) {
		t.Fatal("an open, quiet connection: not alive")
	}
	s.Close()
	waitFor(t, "the peer's close to be seen", func() bool { return !connAlive(c) })
	c.Close()

	c, s = pair()
	defer s.Close()
	s.Write([]byte("x"))
	waitFor(t, "the unasked byte to be seen", func() bool { return !connAlive(c) })
	c.Close()
}
