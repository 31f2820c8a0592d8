// Package redisserver runs a real redis-server as a child process on a free
// loopback port. The dev stack and the tests use it; production points the
// services at its own Redis instead.
package redisserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNotInstalled means no redis-server binary was found.
var ErrNotInstalled = errors.New("redis-server not found in PATH: install it with `apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis` (macOS)")

// Options configure a child redis-server.
type Options struct {
	// Dir holds the server's working files. Empty means a new temporary
	// directory, removed by Close.
	Dir string
	// Port to listen on. Zero picks a free loopback port.
	Port int
	// Args are extra redis-server arguments, such as "--maxmemory", "1gb".
	Args []string
	// Log receives the server's output lines. Nil discards them.
	Log func(line string)
}

// Server is a running redis-server child.
type Server struct {
	// Addr is host:port on 127.0.0.1.
	Addr string

	cmd     *exec.Cmd
	dir     string
	tempDir bool
	exited  chan struct{}
}

// Start launches redis-server and returns once it answers PING.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		for _, p := range []string{"/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
				break
			}
		}
		if err != nil {
			return nil, ErrNotInstalled
		}
	}
	s := &Server{dir: opts.Dir}
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "stillthere-redis-"); err != nil {
			return nil, err
		}
		s.tempDir = true
	} else if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	// A free port found by listening on :0 can be taken by someone else
	// before redis binds it, so retry a few times with a fresh port.
	for attempt := 0; attempt < 5; attempt++ {
		port := opts.Port
		if port == 0 {
			if port, err = freePort(); err != nil {
				break
			}
		}
		if err = s.start(ctx, bin, port, opts); err == nil || opts.Port != 0 {
			break
		}
	}
	if err != nil {
		s.cleanup()
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context, bin string, port int, opts Options) error {
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "yes",
		"--notify-keyspace-events", "Ex",
	}
	args = append(args, opts.Args...)
	cmd := exec.Command(bin, args...)
	// Its own process group, so a Ctrl-C on the dev stack reaches the stack
	// first and the stack shuts redis down in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	var tail []string
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if len(tail) < 20 {
				tail = append(tail, line)
			}
			if opts.Log != nil {
				opts.Log(line)
			}
		}
		cmd.Wait()
		close(exited)
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ping(addr) == nil {
			s.Addr, s.cmd, s.exited = addr, cmd, exited
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server on port %d exited at start: %s", port, strings.Join(tail, " | "))
		case <-ctx.Done():
			cmd.Process.Kill()
			<-exited
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on port %d did not answer PING within 10s", port)
		}
	}
}

// ping sends an inline PING and waits for +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Close stops the server with SIGTERM and waits for it to exit.
func (s *Server) Close() error {
	if s.cmd != nil {
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			s.cmd.Process.Kill()
			<-s.exited
		}
	}
	s.cleanup()
	return nil
}

// Kill stops the server abruptly, as a crash would, and waits for it.
func (s *Server) Kill() {
	s.cmd.Process.Kill()
	<-s.exited
}

func (s *Server) cleanup() {
	if s.tempDir {
		os.RemoveAll(s.dir)
	}
}

// Dir is the server's working directory.
func (s *Server) Dir() string { return filepath.Clean(s.dir) }
