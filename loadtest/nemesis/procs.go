package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// readyWithin bounds a service's start, up to its healthz answering.
	readyWithin = 20 * time.Second
	// startAttempts: a port the previous run held may be taken for a
	// moment by another process's outgoing connection.
	startAttempts = 3
	// stopGrace is how long a service may drain on SIGTERM before it is
	// killed.
	stopGrace = 10 * time.Second
)

// service is one child process of the run (a gateway, an expiry
// listener, a guide consumer) on fixed addresses, so that a restart is a
// new instance where the old one was, as a new pod behind the same
// service would be. Its methods are called by the fault that owns it at
// the time (the schedule never gives one service to two faults at once)
// and by the run's end.
type service struct {
	name   string // gateway-0, listener-1, ...
	kind   string // gateway, listener, consumer
	bin    string
	env    []string                  // settings every start shares
	extra  func(gen int) []string    // settings of one start (an instance id)
	seeds  func() []string           // settings read anew at each start: Redis's nodes as they are now
	admin  string                    // host:port of healthz and metrics
	logs   *os.File                  // stderr of every start, appended
	onExit func(s *service, gen int) // told when a start's process ended

	mu     sync.Mutex
	gen    int
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
}

// freeAddr is a loopback address free at the time of asking, on a port
// below the kernel's ephemeral range. A port from that range can be taken
// by any process's outgoing connection (a gateway's to Redis, a
// listener's to Kafka) between the asking and the service's bind, and
// stays taken while that connection lives: every start would fail alike.
func freeAddr() (string, error) {
	low := ephemeralLow()
	const from = 10000
	for range 200 {
		port := from + rand.IntN(low-from)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken: another try
		}
		l.Close()
		return l.Addr().String(), nil
	}
	return "", fmt.Errorf("no free port in [%d, %d) after 200 tries", from, low)
}

// ephemeralLow is the first port of the kernel's ephemeral range, or
// Linux's default when it cannot be read.
func ephemeralLow() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return linuxDefault
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low <= 11000 {
		return linuxDefault
	}
	return low
}

// start starts the service and returns once its healthz answers.
func (s *service) start(ctx context.Context) error {
	var err error
	for range startAttempts {
		if err = s.startOnce(ctx); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func (s *service) startOnce(ctx context.Context) error {
	s.mu.Lock()
	s.gen++
	gen := s.gen
	cmd := exec.Command(s.bin)
	// A process group of its own, which gets SIGKILL if this program
	// dies: no child outlives the run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// The last of duplicate keys wins: the seeds override env's.
	cmd.Env = append(append(append(os.Environ(), s.env...), s.extra(gen)...), s.seeds()...)
	cmd.Stderr = s.logs
	cmd.Stdout = s.logs
	logFrom, _ := s.logs.Seek(0, io.SeekCurrent)
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	done := make(chan struct{})
	s.cmd, s.done, s.paused = cmd, done, false
	s.mu.Unlock()
	go func() {
		cmd.Wait()
		close(done)
		if s.onExit != nil {
			s.onExit(s, gen)
		}
	}()
	deadline := time.Now().Add(readyWithin)
	client := &http.Client{Timeout: time.Second}
	for {
		if resp, err := client.Get("http://" + s.admin + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited before it was up: %v; its log:\n%s", s.name, cmd.ProcessState, s.logTail(logFrom, 20))
		case <-ctx.Done():
			s.kill()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // a poll of a process's port: real time
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("%s not up within %v", s.name, readyWithin)
		}
	}
}

// logTail is the last n lines the service logged from offset from on.
func (s *service) logTail(from int64, n int) string {
	b, err := os.ReadFile(s.logs.Name())
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	if from > int64(len(b)) {
		from = 0
	}
	lines := strings.Split(strings.TrimRight(string(b[from:]), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// signal sends sig to the service's process group, if it runs.
func (s *service) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		syscall.Kill(-s.cmd.Process.Pid, sig)
	}
	switch sig {
	case syscall.SIGSTOP:
		s.paused = true
	case syscall.SIGCONT:
		s.paused = false
	}
}

func (s *service) pause()  { s.signal(syscall.SIGSTOP) }
func (s *service) resume() { s.signal(syscall.SIGCONT) }

// kill ends the service with SIGKILL, as a crash would, and waits for it.
func (s *service) kill() {
	s.signal(syscall.SIGKILL)
	s.wait(time.Minute)
}

// stop drains the service with SIGTERM, killing it after stopGrace.
func (s *service) stop() {
	s.signal(syscall.SIGCONT)
	s.signal(syscall.SIGTERM)
	if !s.wait(stopGrace) {
		s.kill()
	}
}

// wait reports whether the running start ended within d.
func (s *service) wait(d time.Duration) bool {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// up reports whether a start runs and is not paused.
func (s *service) up() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil || s.paused {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// generation is the number of the current start.
func (s *service) generation() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}
