// Package redisserver runs a real redis-server as a child process on a free
// loopback port. The dev stack and the tests use it; production points the
// services at its own Redis instead.
package redisserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
	// AOF turns on the append-only file, fsynced on every write, so that
	// Restart after Kill finds every acknowledged write. False, the
	// default, keeps nothing on disk.
	AOF bool
	// Args are extra redis-server arguments, such as "--maxmemory", "1gb".
	// They come after the ones Options set, so they override them.
	Args []string
	// Log receives the server's output lines. Nil discards them.
	Log func(line string)
	// Nice, when not 0, runs the server at this scheduling priority
	// (nice(1): -20 highest, 19 lowest), as a benchmark does that shares
	// a few cores between Redis and many processes of its own, where in
	// production Redis has cores of its own. A priority the process may
	// not take is left as it is (nice says so on the server's output).
	Nice int
}

// Server is a redis-server child. Its methods may be called from any
// goroutine.
type Server struct {
	// Addr is host:port on 127.0.0.1. Restarts keep it.
	Addr string

	bin     string
	port    int
	opts    Options
	dir     string
	tempDir bool

	// mu guards proc, which Restart replaces while another goroutine may
	// pause or kill the server. It is held while waiting for a child to
	// exit or to start, so that the two never overlap.
	mu   sync.Mutex
	proc *child
}

// child is one run of redis-server.
type child struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has been reaped
}

// kill stops the child with SIGKILL, which works on a paused one too,
// and waits until it has been reaped.
func (c *child) kill() {
	c.cmd.Process.Kill()
	<-c.exited
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
	s := &Server{bin: bin, opts: opts, dir: opts.Dir}
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
		var c *child
		if c, err = s.launch(ctx, port); err == nil {
			s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			s.port, s.proc = port, c
			break
		}
		if opts.Port != 0 {
			break
		}
	}
	if err != nil {
		s.cleanup()
		return nil, err
	}
	return s, nil
}

// errPortInUse means redis-server could not bind its port.
var errPortInUse = errors.New("port in use")

// args are the redis-server arguments for a run on port.
func (s *Server) args(port int) []string {
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--daemonize", "no",
		"--protected-mode", "yes",
		"--notify-keyspace-events", "Ex",
	}
	if s.opts.AOF {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	return append(args, s.opts.Args...)
}

// launch starts redis-server on port and returns once it answers PING.
func (s *Server) launch(ctx context.Context, port int) (*child, error) {
	opts := s.opts
	cmd := exec.Command(s.bin, s.args(port)...)
	if opts.Nice != 0 {
		cmd = exec.Command("nice", append([]string{"-n", strconv.Itoa(opts.Nice), s.bin}, s.args(port)...)...)
	}
	// Its own process group, so a Ctrl-C on the dev stack reaches the stack
	// first and the stack shuts redis down in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
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
		// Ours, not a server that took the port first (ours then exits
		// with "Address already in use").
		if ownServer(addr, cmd.Process.Pid) == nil {
			return &child{cmd: cmd, exited: exited}, nil
		}
		select {
		case <-exited:
			msg := strings.Join(tail, " | ")
			if strings.Contains(msg, "Address already in use") {
				return nil, fmt.Errorf("redis-server on port %d: %w: %s", port, errPortInUse, msg)
			}
			return nil, fmt.Errorf("redis-server on port %d exited at start: %s", port, msg)
		case <-ctx.Done():
			cmd.Process.Kill()
			<-exited
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return nil, fmt.Errorf("redis-server on port %d did not answer as ours and loaded within 10s", port)
		}
	}
}

// ownServer asks the server at addr for its process id and whether it
// is loading its dataset (INFO: its server and persistence sections), and
// fails unless it is pid and done loading: INFO is answered while the
// dataset loads, and every read then is refused with LOADING.
func ownServer(addr string, pid int) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("INFO\r\n")); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil {
		return fmt.Errorf("unexpected reply %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	if !strings.Contains(string(body), "\nprocess_id:"+strconv.Itoa(pid)+"\r") {
		return fmt.Errorf("another server answers on %s", addr)
	}
	if !strings.Contains(string(body), "\nloading:0\r") {
		return fmt.Errorf("the server on %s is loading its dataset", addr)
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

// Close stops the server with SIGTERM, waits for it to exit, and removes
// a temporary Dir.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.proc; c != nil {
		c.cmd.Process.Signal(syscall.SIGTERM)
		// A paused server acts on SIGTERM only once it runs again.
		c.cmd.Process.Signal(syscall.SIGCONT)
		select {
		case <-c.exited:
		case <-time.After(5 * time.Second):
			c.kill()
		}
	}
	s.cleanup()
	return nil
}

// Kill stops the server abruptly, as a crash would, and waits for it.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proc.kill()
}

func (s *Server) cleanup() {
	if s.tempDir {
		os.RemoveAll(s.dir)
	}
}

// Dir is the server's working directory.
func (s *Server) Dir() string { return filepath.Clean(s.dir) }
