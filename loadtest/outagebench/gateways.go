package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
)

const (
	// readyWithin bounds a gateway's start, up to its readyz answering 200.
	readyWithin = 15 * time.Second
	// startAttempts is how often a start is tried: a port the previous
	// run held may be taken for a moment by another process's outgoing
	// connection.
	startAttempts = 3
	// stopGrace is how long a gateway may drain on SIGTERM before it is
	// killed.
	stopGrace = 15 * time.Second
)

// gateways are the gateway processes of a run. Their addresses stay the
// same across restarts, as behind a load balancer; each start is a new
// instance id, as a new pod would be.
type gateways struct {
	bin   string
	env   []string // settings every instance shares
	addrs []gwAddrs
	logs  *tally
	gen   int
	procs []*gwProc
}

type gwAddrs struct{ public, push string }

type gwProc struct {
	id   string
	cmd  *exec.Cmd
	done chan struct{}
}

func newGateways(bin string, n int, env []string, logs *tally) (*gateways, error) {
	g := &gateways{bin: bin, env: env, logs: logs}
	for range n {
		var a gwAddrs
		var err error
		if a.public, err = freeAddr(); err != nil {
			return nil, err
		}
		if a.push, err = freeAddr(); err != nil {
			return nil, err
		}
		g.addrs = append(g.addrs, a)
	}
	return g, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// urls are the gateways' WebSocket URLs.
func (g *gateways) urls() []string {
	var out []string
	for _, a := range g.addrs {
		out = append(out, "ws://"+a.public+"/v1/ws")
	}
	return out
}

// start starts every gateway and returns once all are ready.
func (g *gateways) start(ctx context.Context) error {
	g.gen++
	g.procs = g.procs[:0]
	errs := make(chan error, len(g.addrs))
	procs := make([]*gwProc, len(g.addrs))
	for i := range g.addrs {
		go func() {
			var err error
			for range startAttempts {
				if procs[i], err = g.startOne(ctx, i); err == nil || ctx.Err() != nil {
					break
				}
			}
			errs <- err
		}()
	}
	var first error
	for range g.addrs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	for _, p := range procs {
		if p != nil {
			g.procs = append(g.procs, p)
		}
	}
	return first
}

// startOne starts gateway i in a process group of its own, which gets
// SIGKILL if this program dies, and waits until it is ready.
func (g *gateways) startOne(ctx context.Context, i int) (*gwProc, error) {
	a := g.addrs[i]
	p := &gwProc{id: fmt.Sprintf("outage-gw-%d-%d", i, g.gen), done: make(chan struct{})}
	p.cmd = exec.Command(g.bin)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd.Env = append(append(os.Environ(), g.env...),
		"STILLTHERE_GATEWAY_ADDR="+a.public,
		"STILLTHERE_PUSH_ADDR="+a.push,
		"STILLTHERE_INSTANCE_ID="+p.id,
	)
	p.cmd.Stderr = g.logs.writer("gateway")
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start gateway %s: %w", p.id, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(readyWithin)
	for {
		if resp, err := http.Get("http://" + a.push + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("gateway %s exited before it was ready: %v", p.id, p.cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.kill()
			return nil, fmt.Errorf("gateway %s not ready within %v", p.id, readyWithin)
		}
	}
}

// kill ends every gateway with SIGKILL, as a crash would: no drain, no
// leave.
func (g *gateways) kill() {
	for _, p := range g.procs {
		p.kill()
	}
	g.procs = nil
}

// stop drains every gateway with SIGTERM, killing what is left after
// stopGrace.
func (g *gateways) stop() {
	for _, p := range g.procs {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	for _, p := range g.procs {
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			p.kill()
		}
	}
	g.procs = nil
}

func (p *gwProc) kill() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}
