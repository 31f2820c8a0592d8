package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestLeanServer: net/http's client, as the consumer's sender uses it,
// gets each post's status on connections kept alive, and the handler
// each body whole; what the server does not read is a 400 and the end of
// its connection.
func TestLeanServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	srv := serveLean(ln, func(b []byte) int {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(b))
		if string(b) == "bad" {
			return 400
		}
		return 200
	})
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/guide"

	var dials int
	var dmu sync.Mutex
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dmu.Lock()
		dials++
		dmu.Unlock()
		return d.DialContext(ctx, network, addr)
	}}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	big := strings.Repeat("x", 20<<10) // past the server's read buffer
	bodies := []string{`{"id":"a"}`, "", big, "bad", `{"id":"b"}`}
	for _, b := range bodies {
		resp, err := client.Post(url, "application/json", strings.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want := 200
		if b == "bad" {
			want = 400
		}
		if resp.StatusCode != want {
			t.Fatalf("post of %d bytes: status %d, want %d", len(b), resp.StatusCode, want)
		}
	}
	mu.Lock()
	if len(got) != len(bodies) {
		t.Fatalf("handler got %d bodies, want %d", len(got), len(bodies))
	}
	for i := range bodies {
		if got[i] != bodies[i] {
			t.Fatalf("body %d: got %d bytes, want %d", i, len(got[i]), len(bodies[i]))
		}
	}
	mu.Unlock()
	if dials != 1 {
		t.Fatalf("%d connections for %d posts, want 1 kept alive", dials, len(bodies))
	}

	// Raw: two requests in one write (pipelined), then one without a
	// length, then nothing more is read from that connection.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /g HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiPOST /g HTTP/1.1\r\ncontent-length: 3\r\n\r\nbad"+
		"POST /g HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
	r := bufio.NewReader(c)
	for i, want := range []string{"200", "400", "400"} {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		if !strings.HasPrefix(resp.Status, want) {
			t.Fatalf("response %d: %s, want %s", i, resp.Status, want)
		}
		if i == 2 && !resp.Close {
			t.Fatal("a request not read leaves its connection open")
		}
	}
	if rest, _ := io.ReadAll(r); len(rest) != 0 {
		t.Fatalf("after the refused request: %q", rest)
	}
}
