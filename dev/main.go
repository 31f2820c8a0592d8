// Command dev runs the whole stillthere pipeline on this machine: a
// redis-server child, an embedded Kafka, and the three services, and
// prints where everything listens with a ready-made dev token. Every
// STILLTHERE_* setting is honored, e.g.
//
//	STILLTHERE_SESSION_TTL=10s STILLTHERE_SESSION_JITTER=1s go run ./dev
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/stillthere/stillthere/pkg/daemon"
	"github.com/stillthere/stillthere/pkg/devstack"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dev:", err)
		os.Exit(1)
	}
}

func run() error {
	logger, err := daemon.NewLogger(os.Stderr, func(k string) (string, bool) {
		if k == "STILLTHERE_LOG_FORMAT" {
			if v, ok := os.LookupEnv(k); ok {
				return v, true
			}
			return "text", true // readable in a terminal unless asked otherwise
		}
		return os.LookupEnv(k)
	})
	if err != nil {
		return err
	}
	port, err := devstack.KafkaPortFromEnv(os.LookupEnv)
	if err != nil {
		return err
	}
	dataDir := devstack.DataDirFromEnv(os.LookupEnv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	s, err := devstack.Start(ctx, devstack.Options{
		Env:       os.LookupEnv,
		DataDir:   dataDir,
		KafkaPort: port,
		Logger:    logger,
	})
	if err != nil {
		return err
	}
	defer s.Close()
	s.Banner(os.Stdout)
	if err := os.WriteFile(filepath.Join(dataDir, "dev-token"), []byte(s.DevToken+"\n"), 0o600); err != nil {
		return err
	}
	fmt.Printf("  (the token is also in %s; Ctrl-C stops the stack)\n\n", filepath.Join(dataDir, "dev-token"))
	return s.Run(ctx)
}
