// Package daemon is the process shell the three services share: logging
// set up from the environment, config loaded from flags and environment,
// and one root context cancelled by SIGINT or SIGTERM.
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/lifecycle"
)

// Main loads a service's config, opens it, runs it until a signal and
// closes it, then exits: 0 on a clean stop, 1 on a failure, 2 on a bad
// configuration. gcPercent is the service's garbage collector goal
// (TuneGC).
func Main[C any, S lifecycle.Service](name string, gcPercent int, load func([]string, config.Lookup) (C, error), open func(context.Context, C, *slog.Logger) (S, error)) {
	Service(name, gcPercent, os.Args[1:], load, open)
}

// Service is Main for a service that a subcommand starts ("gateway
// canary"), with its own args.
func Service[C any, S lifecycle.Service](name string, gcPercent int, args []string, load func([]string, config.Lookup) (C, error), open func(context.Context, C, *slog.Logger) (S, error)) {
	logger, err := NewLogger(os.Stderr, os.LookupEnv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	logger = logger.With("service", name)
	cfg, err := load(args, os.LookupEnv)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	gogc, limit := TuneGC(gcPercent)
	logger.Info("garbage collector", "gogc", gogc, "memory_limit_bytes", limit)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, logger, open); err != nil {
		logger.Error("exiting", "err", err)
		stop()
		os.Exit(1)
	}
}

// run opens a service, runs it until ctx is done, and closes it.
func run[C any, S lifecycle.Service](ctx context.Context, cfg C, logger *slog.Logger, open func(context.Context, C, *slog.Logger) (S, error)) error {
	s, err := open(ctx, cfg, logger)
	if err != nil {
		return err
	}
	err = s.Run(ctx)
	if cerr := s.Close(); cerr != nil {
		logger.Warn("close", "err", cerr)
	}
	return err
}

// NewLogger builds the slog logger from STILLTHERE_LOG_LEVEL (debug, info,
// warn, error; default info) and STILLTHERE_LOG_FORMAT (json or text;
// default json).
func NewLogger(w io.Writer, env config.Lookup) (*slog.Logger, error) {
	level, _ := env(config.EnvName("log-level"))
	format, _ := env(config.EnvName("log-format"))
	var lv slog.Level
	if level != "" {
		if err := lv.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("%s=%q: want debug, info, warn or error", config.EnvName("log-level"), level)
		}
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "", "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("%s=%q: want json or text", config.EnvName("log-format"), format)
	}
}

// Tool runs a one-shot operator command and exits: 0 when it succeeds, 1
// with its error otherwise.
func Tool(name string, args []string, run func(context.Context, []string, config.Lookup, io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, args, os.LookupEnv, os.Stdout)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	os.Exit(0)
}
