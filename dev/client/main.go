// Command client is a tiny stillthere chat client for trying the pipeline:
// it connects, pings a few times, goes silent, and prints the guide that
// arrives about one session TTL later, with how late past the deadline.
//
//	go run ./dev/client                       # token from .stillthere/dev-token
//	go run ./dev/client -token <jwt> -pings 5 -every 2s
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gorilla/websocket"
)

func main() {
	url := flag.String("url", "ws://127.0.0.1:8080/v1/ws", "gateway WebSocket URL")
	tok := flag.String("token", "", "JWT (default: $STILLTHERE_DEV_TOKEN, then .stillthere/dev-token)")
	pings := flag.Int("pings", 3, "pings to send before going silent")
	every := flag.Duration("every", 2*time.Second, "pause between pings")
	wait := flag.Duration("wait", 5*time.Minute, "how long to wait for the guide once silent")
	flag.Parse()
	if err := run(*url, *tok, *pings, *every, *wait); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
}

func findToken(tok string) (string, error) {
	if tok != "" {
		return tok, nil
	}
	if v := os.Getenv("STILLTHERE_DEV_TOKEN"); v != "" {
		return v, nil
	}
	b, err := os.ReadFile(".stillthere/dev-token")
	if err != nil {
		return "", errors.New("no token: pass -token, set STILLTHERE_DEV_TOKEN, or start the dev stack (make run) which writes .stillthere/dev-token")
	}
	return strings.TrimSpace(string(b)), nil
}

type serverFrame struct {
	Type    string `json:"type"`
	TTLMS   int64  `json:"ttl_ms"`
	ID      string `json:"id"`
	Text    string `json:"text"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func run(url, tok string, pings int, every, wait time.Duration) error {
	tok, err := findToken(tok)
	if err != nil {
		return err
	}
	h := http.Header{"Authorization": {"Bearer " + tok}}
	ws, resp, err := websocket.DefaultDialer.Dial(url, h)
	if err != nil {
		if resp != nil {
			return fmt.Errorf("connect %s: %s", url, resp.Status)
		}
		return fmt.Errorf("connect %s: %w", url, err)
	}
	defer ws.Close()
	fmt.Printf("%s connected to %s\n", stamp(), url)

	var deadline time.Time
	for i := 0; i < pings; i++ {
		if i > 0 {
			time.Sleep(every)
		}
		sent := time.Now()
		if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
			return err
		}
		f, err := read(ws, time.Now().Add(10*time.Second))
		if err != nil {
			return err
		}
		if f.Type != "pong" {
			return fmt.Errorf("expected a pong, got %+v", f)
		}
		deadline = sent.Add(time.Duration(f.TTLMS) * time.Millisecond)
		fmt.Printf("%s ping -> pong, session granted %v\n", stamp(), time.Duration(f.TTLMS)*time.Millisecond)
	}
	fmt.Printf("%s going silent; the session's deadline is about %s\n", stamp(), deadline.Format("15:04:05.000"))
	for {
		f, err := read(ws, time.Now().Add(wait))
		if err != nil {
			return fmt.Errorf("no guide within %v: %w", wait, err)
		}
		if f.Type != "guide" {
			fmt.Printf("%s received %+v\n", stamp(), f)
			continue
		}
		fmt.Printf("%s guide %q (id %s), %v after the deadline\n", stamp(), f.Text, f.ID,
			time.Since(deadline).Round(time.Millisecond))
		ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ack","id":"`+f.ID+`"}`))
		// Leave deliberately: a normal close ends the session.
		ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(time.Second))
		return nil
	}
}

func read(ws *websocket.Conn, deadline time.Time) (serverFrame, error) {
	ws.SetReadDeadline(deadline)
	_, b, err := ws.ReadMessage()
	if err != nil {
		return serverFrame{}, err
	}
	var f serverFrame
	if err := json.Unmarshal(b, &f); err != nil {
		return serverFrame{}, fmt.Errorf("server sent %q: %w", b, err)
	}
	return f, nil
}

func stamp() string { return time.Now().Format("15:04:05.000") }
