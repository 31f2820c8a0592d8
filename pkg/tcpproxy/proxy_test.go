package tcpproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

// Timing of the client under test: a command that fails in well under
// readTimeout failed fast, rather than by timing out.
const (
	readTimeout = 300 * time.Millisecond
	failFast    = 150 * time.Millisecond
)

func start(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatalf("start proxy: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// client fails a command at once rather than retrying it, so that each
// command shows the link's state at that moment.
func client(t *testing.T, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr:         addr,
		MaxRetries:   -1,
		DialTimeout:  readTimeout,
		ReadTimeout:  readTimeout,
		WriteTimeout: readTimeout,
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func isTimeout(err error) bool {
	var nerr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &nerr) && nerr.Timeout()
}

func TestFaults(t *testing.T) {
	srv := redistest.Start(t)
	tests := []struct {
		name  string
		fault func(*Proxy)
		// want judges each command sent during the fault.
		want func(t *testing.T, err error, took time.Duration)
	}{
		{"forwarding", func(*Proxy) {}, func(t *testing.T, err error, _ time.Duration) {
			if err != nil {
				t.Fatalf("command: %v", err)
			}
		}},
		{"cut", (*Proxy).Cut, func(t *testing.T, err error, took time.Duration) {
			if err == nil || isTimeout(err) || took > failFast {
				t.Fatalf("command while cut: %v after %v, want a fast failure", err, took)
			}
		}},
		{"blackhole", (*Proxy).Blackhole, func(t *testing.T, err error, took time.Duration) {
			if !isTimeout(err) || took < readTimeout {
				t.Fatalf("command while blackholed: %v after %v, want a timeout", err, took)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			p := start(t, srv.Addr)
			rdb := client(t, p.Addr())
			key := redistest.Prefix(t) + ":k"
			// Leaves a pooled connection for the fault to break.
			if err := rdb.Set(ctx, key, "v", 0).Err(); err != nil {
				t.Fatalf("set through proxy: %v", err)
			}

			tt.fault(p)
			// The first command finds the pooled connection, the later
			// ones dial new connections.
			for range 3 {
				began := time.Now()
				err := rdb.Get(ctx, key).Err()
				tt.want(t, err, time.Since(began))
			}

			p.Restore()
			if got, err := rdb.Get(ctx, key).Result(); err != nil || got != "v" {
				t.Fatalf("get after restore: %q, %v", got, err)
			}
		})
	}
}

// dial connects to the proxy and sends a PING.
func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial proxy: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatalf("write: %v", err)
	}
	return c
}

// read reads from c for at most d.
func read(c net.Conn, d time.Duration) (string, error) {
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

func TestCutClosesNewConnections(t *testing.T) {
	srv := redistest.Start(t)
	p := start(t, srv.Addr)
	p.Cut()
	c := dial(t, p)
	if got, err := read(c, time.Second); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("read while cut: %q, %v; want the connection closed", got, err)
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

func TestBlackholeDropsThenRestoreCloses(t *testing.T) {
	srv := redistest.Start(t)
	p := start(t, srv.Addr)
	open := dial(t, p) // opened while forwarding
	if got, err := read(open, time.Second); err != nil || got != "+PONG\r\n" {
		t.Fatalf("ping through proxy: %q, %v", got, err)
	}

	p.Blackhole()
	late := dial(t, p) // opened while blackholed
	for name, c := range map[string]net.Conn{"open": open, "late": late} {
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			t.Fatalf("%s: write while blackholed: %v", name, err)
		}
		if got, err := read(c, 200*time.Millisecond); !isTimeout(err) {
			t.Fatalf("%s: read while blackholed: %q, %v; want a timeout", name, got, err)
		}
	}

	p.Restore()
	for name, c := range map[string]net.Conn{"open": open, "late": late} {
		if got, err := read(c, time.Second); err == nil || isTimeout(err) {
			t.Fatalf("%s: read after restore: %q, %v; want the connection closed", name, got, err)
		}
	}
	if got, err := read(dial(t, p), time.Second); err != nil || got != "+PONG\r\n" {
		t.Fatalf("ping after restore: %q, %v", got, err)
	}
}

func TestTargetDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	p := start(t, down)
	if got, err := read(dial(t, p), time.Second); err == nil || isTimeout(err) {
		t.Fatalf("read with the target down: %q, %v; want the connection closed", got, err)
	}
}

// proxyFrames counts the stack frames of the proxy's goroutines.
func proxyFrames() int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return strings.Count(string(buf[:n]), "tcpproxy.(*Proxy)")
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	srv := redistest.Start(t)
	tests := []struct {
		name  string
		fault func(*Proxy)
	}{
		{"forwarding", func(*Proxy) {}},
		{"cut", (*Proxy).Cut},
		{"blackhole", (*Proxy).Blackhole},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Start(srv.Addr)
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				read(dial(t, p), time.Second)
			}
			tt.fault(p)
			for range 3 {
				dial(t, p) // left open, idle
			}
			if proxyFrames() == 0 {
				t.Fatal("no proxy goroutine found before Close: the check would prove nothing")
			}
			if err := p.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			// A goroutine still shows for an instant after its deferred
			// wg.Done, so allow it that instant: a leak lasts.
			deadline := time.Now().Add(time.Second)
			for proxyFrames() != 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if n := proxyFrames(); n != 0 {
				buf := make([]byte, 1<<20)
				t.Fatalf("%d proxy frames left after Close:\n%s", n, buf[:runtime.Stack(buf, true)])
			}
			if err := p.Close(); err != nil {
				t.Fatalf("second close: %v", err)
			}
		})
	}
}
