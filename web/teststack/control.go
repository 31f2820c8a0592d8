package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/stillthere/stillthere/pkg/admin"
	"github.com/stillthere/stillthere/pkg/devstack"
	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/token"
)

// control serves the tests' requests: tokens, and restarts of the second
// gateway.
func control(ctx context.Context, s *devstack.Stack, second *restartable) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /token", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		sub, seg := q.Get("sub"), q.Get("seg")
		ttl := time.Hour
		if v := q.Get("ttl"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				admin.WriteError(w, http.StatusBadRequest, fmt.Sprintf("ttl=%q: want a positive duration", v))
				return
			}
			ttl = d
		}
		if sub == "" {
			admin.WriteError(w, http.StatusBadRequest, `sub="": want a user id`)
			return
		}
		tok, err := token.Mint([]byte(s.TokenSecret), sub, seg, ttl)
		if err != nil {
			admin.WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, tok)
	})
	mux.HandleFunc("POST /restart", func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		if err := second.restart(ctx); err != nil {
			admin.WriteError(w, http.StatusInternalServerError, err.Error())
			return
		}
		admin.WriteJSON(w, http.StatusOK, map[string]int64{"tookMs": time.Since(start).Milliseconds()})
	})
	return mux
}

// restartable is a gateway that restarts in place: it drains as on
// SIGTERM (close 1001 to every client; sessions survive), then a new
// instance opens on the same addresses, as after a deploy.
type restartable struct {
	cfg      gateway.Config // its addresses fixed by open
	log      *slog.Logger
	restarts chan chan error // a restart asked for, answered once the next instance listens
}

// open opens the first instance, on addresses the kernel picks, and
// fixes them for the next ones.
func (r *restartable) open(ctx context.Context) (*gateway.Gateway, error) {
	g, err := gateway.Open(ctx, r.cfg, r.log)
	if err != nil {
		return nil, err
	}
	r.cfg.Addr, r.cfg.PushAddr = g.PublicAddr().String(), g.PushAddr().String()
	r.restarts = make(chan chan error)
	return g, nil
}

// run runs g, and each instance a restart opens after it, until ctx is
// done. It alone starts and closes them; Close drains as on SIGTERM.
func (r *restartable) run(ctx context.Context, g *gateway.Gateway) error {
	for {
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		select {
		case <-ctx.Done():
			g.Close()
			return <-done
		case err := <-done:
			g.Close()
			return fmt.Errorf("second gateway stopped: %v", err)
		case reply := <-r.restarts:
			g.Close()
			if err := <-done; err != nil {
				reply <- err
				return fmt.Errorf("second gateway: %w", err)
			}
			var err error
			g, err = gateway.Open(ctx, r.cfg, r.log)
			reply <- err
			if err != nil {
				return fmt.Errorf("second gateway: %w", err)
			}
		}
	}
}

// restart asks run for a restart and waits until the next instance
// listens.
func (r *restartable) restart(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case r.restarts <- reply:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
