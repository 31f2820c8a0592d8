// Command teststack runs a dev stack for the JavaScript tests: the client
// library's, on Node's test runner, and the demo page's, in headless
// Chromium. The stack has a short session TTL, a close stage a few
// seconds after the reminder, a demo bot that thinks for longer than the
// TTL (the page shows no guide meanwhile), every port picked by the
// kernel, and a data directory of its own that it removes on exit. Beside the stack's own
// gateway it runs a second instance, which it restarts on request as a
// deploy does: the tests see the page reconnect.
//
// It prints one JSON line on stdout, where everything listens, then
// serves its control endpoint on loopback:
//
//	GET  /token?sub=alice&seg=vip&ttl=10s   a client token for the stack
//	POST /restart                           restart the second gateway
//
// It stops on SIGINT or SIGTERM, when its standard input closes (the test
// runner that started it went away), or after -max-lifetime. Settings
// other than its own flags come from STILLTHERE_* as in the dev stack.
// web/teststack/stack.js starts it for the tests.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/stillthere/stillthere/pkg/daemon"
	"github.com/stillthere/stillthere/pkg/devstack"
)

func main() {
	ttl := flag.Duration("ttl", 2*time.Second, "session TTL granted on each ping")
	jitter := flag.Duration("jitter", 500*time.Millisecond, "random extra TTL in [0, jitter)")
	closeAfter := flag.Duration("close-after", 3*time.Second, "delay from the reminder to the close stage; 0 none")
	botThink := flag.Duration("bot-think", 5*time.Second, "how long the demo bot thinks before it answers and passes the turn")
	maxLifetime := flag.Duration("max-lifetime", 10*time.Minute, "stop after this long whatever happens")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Standard input is the test runner's pipe: it closes when the runner
	// exits, however it exits, and the stack goes with it.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	ctx, cancel := context.WithTimeout(ctx, *maxLifetime)
	defer cancel()

	settings := map[string]string{
		"STILLTHERE_SESSION_TTL":         ttl.String(),
		"STILLTHERE_SESSION_JITTER":      jitter.String(),
		"STILLTHERE_CLOSE_AFTER":         closeAfter.String(),
		"STILLTHERE_GATEWAY_ADDR":        "127.0.0.1:0",
		"STILLTHERE_PUSH_ADDR":           "127.0.0.1:0",
		"STILLTHERE_LISTENER_ADMIN_ADDR": "127.0.0.1:0",
		"STILLTHERE_CONSUMER_ADMIN_ADDR": "127.0.0.1:0",
		"STILLTHERE_SHUTDOWN_TIMEOUT":    "2s",
		"STILLTHERE_DEMO_PAGE":           "true",
		"STILLTHERE_DEV_BOT_THINK":       botThink.String(),
	}
	env := func(name string) (string, bool) {
		if v, ok := settings[name]; ok {
			return v, true
		}
		return os.LookupEnv(name)
	}
	if err := run(ctx, env); err != nil {
		fmt.Fprintln(os.Stderr, "teststack:", err)
		os.Exit(1)
	}
}

// info is the line printed on stdout for the tests.
type info struct {
	// Gateway is the stack's own gateway, which never restarts; Restartable
	// is the second one, and Demo its demo page (add #token=...).
	Gateway     string `json:"gateway"`
	Restartable string `json:"restartable"`
	Demo        string `json:"demo"`
	// Push is the stack's push endpoint, and PushSecret its bearer
	// secret: the tests push guides of their own through it.
	Push       string `json:"push"`
	PushSecret string `json:"pushSecret"`
	Control    string `json:"control"`
	TTLMS      int64  `json:"ttlMs"`
	JitterMS   int64  `json:"jitterMs"`
	CloseAfter int64  `json:"closeAfterMs"`
	// BotThinkMS is how long the demo bot thinks.
	BotThinkMS int64 `json:"botThinkMs"`
}

func run(ctx context.Context, env func(string) (string, bool)) error {
	logger, err := daemon.NewLogger(os.Stderr, func(k string) (string, bool) {
		switch v, ok := env(k); {
		case ok:
			return v, true
		case k == "STILLTHERE_LOG_FORMAT":
			return "text", true
		case k == "STILLTHERE_LOG_LEVEL":
			return "warn", true
		}
		return "", false
	})
	if err != nil {
		return err
	}
	dataDir, err := os.MkdirTemp("", "stillthere-teststack-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	s, err := devstack.Start(ctx, devstack.Options{Env: env, DataDir: dataDir, Logger: logger})
	if err != nil {
		return err
	}
	defer s.Close() // Redis and Kafka included
	second := &restartable{cfg: s.GatewayConfig, log: logger.With("service", "gateway", "instance", "restartable")}
	second.cfg.Addr, second.cfg.PushAddr, second.cfg.InstanceID = "127.0.0.1:0", "127.0.0.1:0", ""
	g2, err := second.open(ctx)
	if err != nil {
		return fmt.Errorf("second gateway: %w", err)
	}

	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return s.Run(ctx) })
	eg.Go(func() error { return second.run(ctx, g2) })
	ctl := &http.Server{Handler: control(ctx, s, second), ReadHeaderTimeout: 5 * time.Second}
	eg.Go(func() error {
		go func() { <-ctx.Done(); ctl.Close() }()
		if err := ctl.Serve(ln); err != http.ErrServerClosed {
			return err
		}
		return nil
	})

	g := s.GatewayConfig
	line, _ := json.Marshal(info{
		Gateway:     "ws://" + s.Gateway.PublicAddr().String() + "/v1/ws",
		Restartable: "ws://" + second.cfg.Addr + "/v1/ws",
		Demo:        "http://" + second.cfg.Addr + "/demo/",
		Push:        "http://" + s.Gateway.PushAddr().String() + "/v1/push",
		PushSecret:  g.PushSecret,
		Control:     "http://" + ln.Addr().String(),
		TTLMS:       g.SessionTTL.Milliseconds(),
		JitterMS:    g.SessionJitter.Milliseconds(),
		CloseAfter:  g.Closing.After.Milliseconds(),
		BotThinkMS:  s.BotThink().Milliseconds(),
	})
	fmt.Printf("%s\n", line)
	return eg.Wait()
}
