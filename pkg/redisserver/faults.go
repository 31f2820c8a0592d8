package redisserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// restartBindWait bounds how long Restart retries a port still held by
// the previous run or briefly taken by someone else's outgoing connection.
const restartBindWait = 5 * time.Second

// Pause freezes the server with SIGSTOP until Resume. Its connections stay
// open and the kernel still queues new ones, but nothing is answered. Its
// clock keeps running, so keys whose TTL lapsed meanwhile expire once it
// resumes.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume lets a paused server run again with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

// signal sends sig to the running child. An exited child is not an error:
// a test may pause a server it has killed.
func (s *Server) signal(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proc.cmd.Process.Signal(sig)
}

// Restart starts redis-server again on the same port and in the same Dir,
// with the same Options, and returns once it answers PING. A server
// started with AOF reloads its data. A server still running is killed
// first, as a crash would. After Close, a temporary Dir is gone, and so
// is the data that was in it.
func (s *Server) Restart(ctx context.Context) error {
	return s.restart(ctx, false)
}

// RestartEmpty kills the server, removes its data files, and starts it
// again on the same port, as a node replaced by an empty one.
func (s *Server) RestartEmpty(ctx context.Context) error {
	return s.restart(ctx, true)
}

func (s *Server) restart(ctx context.Context, empty bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proc.kill()
	if empty {
		if err := s.removeData(); err != nil {
			return err
		}
	}
	// Close removed a temporary Dir.
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return err
	}
	deadline := time.Now().Add(restartBindWait)
	for {
		c, err := s.launch(ctx, s.port)
		if err == nil {
			s.proc = c
			return nil
		}
		if !errors.Is(err, errPortInUse) || time.Now().After(deadline) {
			return fmt.Errorf("restart redis-server on %s: %w", s.Addr, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// removeData removes the AOF directory and the RDB file, under the names
// the server's arguments give them.
func (s *Server) removeData() error {
	args := s.args(s.port)
	for _, name := range []string{
		lastArg(args, "--appenddirname", "appendonlydir"),
		lastArg(args, "--dbfilename", "dump.rdb"),
	} {
		if err := os.RemoveAll(filepath.Join(s.dir, name)); err != nil {
			return fmt.Errorf("remove redis data: %w", err)
		}
	}
	return nil
}

// lastArg is the value that redis-server takes for flag from args: the
// last one given, or def.
func lastArg(args []string, flag, def string) string {
	v := def
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			v = args[i+1]
		}
	}
	return v
}
