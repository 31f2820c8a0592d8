package redisserver_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver"
)

func start(t *testing.T, opts redisserver.Options) *redisserver.Server {
	t.Helper()
	opts.Dir = t.TempDir()
	srv, err := redisserver.Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// client fails a command at once rather than retrying it, so that each
// command shows the server's state at that moment.
func client(t *testing.T, srv *redisserver.Server) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr:         srv.Addr,
		MaxRetries:   -1,
		DialTimeout:  200 * time.Millisecond,
		ReadTimeout:  200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond,
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func TestRestart(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		restart func(*redisserver.Server) error
		wantErr error // from GET of the key written before
	}{
		{"kill then restart", func(s *redisserver.Server) error {
			s.Kill()
			return s.Restart(ctx)
		}, nil},
		{"close then restart", func(s *redisserver.Server) error {
			s.Close()
			return s.Restart(ctx)
		}, nil},
		{"restart while running", func(s *redisserver.Server) error {
			return s.Restart(ctx)
		}, nil},
		{"kill then restart empty", func(s *redisserver.Server) error {
			s.Kill()
			return s.RestartEmpty(ctx)
		}, redis.Nil},
		{"restart empty while running", func(s *redisserver.Server) error {
			return s.RestartEmpty(ctx)
		}, redis.Nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := start(t, redisserver.Options{AOF: true})
			rdb := client(t, srv)
			addr := srv.Addr
			if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatalf("set: %v", err)
			}
			if err := tt.restart(srv); err != nil {
				t.Fatalf("restart: %v", err)
			}
			if srv.Addr != addr {
				t.Fatalf("addr changed from %s to %s", addr, srv.Addr)
			}
			got, err := rdb.Get(ctx, "k").Result()
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("get after restart: %q, %v; want error %v", got, err, tt.wantErr)
			}
			if tt.wantErr == nil && got != "v" {
				t.Fatalf("get after restart: %q, want %q", got, "v")
			}

			// The restarted server persists too, and restarts again.
			if err := rdb.Set(ctx, "k2", "v2", 0).Err(); err != nil {
				t.Fatalf("set after restart: %v", err)
			}
			srv.Kill()
			if err := srv.Restart(ctx); err != nil {
				t.Fatalf("second restart: %v", err)
			}
			if got, err := rdb.Get(ctx, "k2").Result(); err != nil || got != "v2" {
				t.Fatalf("get after second restart: %q, %v", got, err)
			}
		})
	}
}

func TestRestartWithoutAOFLosesData(t *testing.T) {
	ctx := context.Background()
	srv := start(t, redisserver.Options{})
	rdb := client(t, srv)
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("set: %v", err)
	}
	srv.Kill()
	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := rdb.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("get after restart: %v, want redis.Nil", err)
	}
}

func TestPause(t *testing.T) {
	ctx := context.Background()
	srv := start(t, redisserver.Options{})
	rdb := client(t, srv)
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping: %v", err)
	}

	srv.Pause()
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := rdb.Ping(cctx).Err()
	cancel()
	if !isTimeout(err) {
		t.Fatalf("ping while paused: %v, want a timeout", err)
	}

	srv.Resume()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after resume: %v", err)
	}
}

func TestCloseWhilePaused(t *testing.T) {
	srv := start(t, redisserver.Options{})
	srv.Pause()
	began := time.Now()
	srv.Close()
	// Close falls back to SIGKILL after 5s; a paused server must not need it.
	if d := time.Since(began); d > 3*time.Second {
		t.Fatalf("close of a paused server took %v", d)
	}
}

func isTimeout(err error) bool {
	var nerr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &nerr) && nerr.Timeout()
}

func TestRestartWaitsForPort(t *testing.T) {
	ctx := context.Background()
	srv := start(t, redisserver.Options{})
	srv.Kill()
	// Someone else holds the port for a moment after the crash.
	l, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		t.Fatalf("take the port: %v", err)
	}
	release := time.AfterFunc(300*time.Millisecond, func() { l.Close() })
	defer release.Stop()
	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := client(t, srv).Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
}
