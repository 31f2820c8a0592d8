package gateway

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestParkedConnectionsClosed: neither listener lets a client hold a
// connection it does not use. The public one closes after any answer but
// an upgrade, and a connection that sends nothing within the handshake
// timeout; the internal one closes a keep-alive connection idle for its
// idle timeout.
func TestParkedConnectionsClosed(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.HandshakeTimeout = 300 * time.Millisecond
		c.PushIdleTimeout = 300 * time.Millisecond
	})
	tests := []struct {
		name    string
		addr    net.Addr
		request string // "" sends nothing
		status  int
	}{
		{"public, refused upgrade", tg.PublicAddr(), "GET /v1/ws HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusUnauthorized},
		{"public, unknown path", tg.PublicAddr(), "GET /favicon.ico HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusNotFound},
		{"public, silent", tg.PublicAddr(), "", 0},
		{"public, headers never end", tg.PublicAddr(), "GET /v1/ws HTTP/1.1\r\nHost: x\r\n", 0},
		{"internal, refused push", tg.PushAddr(), "POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", http.StatusUnauthorized},
		{"internal, health then idle", tg.PushAddr(), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusOK},
		{"internal, silent", tg.PushAddr(), "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", tt.addr.String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			// Bounded well above the 300ms timeouts, far below forever.
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(nc)
			if tt.request != "" {
				if _, err := io.WriteString(nc, tt.request); err != nil {
					t.Fatal(err)
				}
			}
			if tt.status != 0 {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("read answer: %v", err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tt.status {
					t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
				}
			}
			start := time.Now()
			_, err = br.ReadByte()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("connection still open after %v", time.Since(start).Round(time.Millisecond))
			}
			if err == nil {
				t.Fatal("server sent more than its answer")
			}
		})
	}
}

// TestRefusedUpgradeSaysClose: a browser or proxy sees from the answer
// itself that the connection ends.
func TestRefusedUpgradeSaysClose(t *testing.T) {
	tg := startGateway(t, nil)
	resp, err := http.Get("http://" + tg.PublicAddr().String() + "/v1/ws?token=nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("status %d, close %v; want 401 and Connection: close", resp.StatusCode, resp.Close)
	}
}

// TestPushSecretFromHeaderOnly: the push secret in the query string, where
// proxies log it, is not taken.
func TestPushSecretFromHeaderOnly(t *testing.T) {
	tg := startGateway(t, nil)
	body := strings.NewReader(`{"uid":"alice","id":"0123456789abcdef0123456789abcdef","text":"Still there?"}`)
	resp, err := http.Post("http://"+tg.PushAddr().String()+"/v1/push?token="+pushSecret, "application/json", body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("push with the secret in the query: status %d, want 401", resp.StatusCode)
	}
	if code, _ := tg.push(t, pushSecret, map[string]any{"uid": "alice", "id": "0123456789abcdef0123456789abcdef", "text": "Still there?"}); code != http.StatusOK && code != http.StatusAccepted {
		t.Fatalf("push with the secret in the header: status %d", code)
	}
}
