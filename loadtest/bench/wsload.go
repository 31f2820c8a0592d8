package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// fleet is a set of wsload processes holding connections to the
// gateways. Process p holds users <tag><p>-<i>, connection i on gateway
// i mod len(gateways) and source address 127.<tag byte>.<p+1>.<i mod ips + 1>,
// so every address pair stays far inside the ephemeral port range.
type fleet struct {
	procs  []*loader
	gwURLs []string

	stopOnce sync.Once
	res      loadResult
	err      error
}

type loader struct {
	cmd    *exec.Cmd
	prefix string
	conns  int
	ramped chan struct{}
	done   chan struct{}
	res    loadResult
	err    error
}

// loadResult is a wsload RESULT line.
type loadResult struct {
	Conns, Failed, Dropped, Closed, Pings, Pongs, Guides, GuideIDs int
}

func (r *loadResult) add(o loadResult) {
	r.Conns += o.Conns
	r.Failed += o.Failed
	r.Dropped += o.Dropped
	r.Closed += o.Closed
	r.Pings += o.Pings
	r.Pongs += o.Pongs
	r.Guides += o.Guides
	r.GuideIDs += o.GuideIDs
}

type fleetSpec struct {
	tag      string        // user id prefix and source network of this load
	netByte  int           // second byte of the source addresses, 127.<netByte>.x.y
	conns    int           // in all
	procs    int           // wsload processes
	every    time.Duration // ping interval
	ramp     int           // connections per second, in all
	maxHold  time.Duration // upper bound; stop ends the hold sooner
	leave    time.Duration // the closes at the end spread over this long
	ipsEach  int           // source addresses per process
	gateways []*gateway
}

// startFleet starts the wsload processes; wait for ramped, then stop.
func startFleet(ctx context.Context, bin string, s secrets, spec fleetSpec) (*fleet, error) {
	f := &fleet{}
	var urls []string
	for _, g := range spec.gateways {
		urls = append(urls, g.url())
	}
	f.gwURLs = urls
	left := spec.conns
	for p := 0; p < spec.procs && left > 0; p++ {
		n := (left + spec.procs - p - 1) / (spec.procs - p)
		left -= n
		var ips []string
		for k := range max(spec.ipsEach, 1) {
			ips = append(ips, fmt.Sprintf("127.%d.%d.%d", spec.netByte, p+1, k+1))
		}
		l := &loader{prefix: spec.tag + strconv.Itoa(p), conns: n, ramped: make(chan struct{}), done: make(chan struct{})}
		l.cmd = command(ctx, 30*time.Second, filepath.Join(bin, "wsload"),
			"-url", strings.Join(urls, ","), "-secret", s.token, "-conns", strconv.Itoa(n),
			"-every", spec.every.String(), "-hold", spec.maxHold.String(),
			"-ramp", strconv.Itoa(max(spec.ramp/spec.procs, 1)),
			"-leave-over", spec.leave.String(), "-uid-prefix", l.prefix, "-local-ips", strings.Join(ips, ","))
		out, err := l.cmd.StdoutPipe()
		if err != nil {
			return f, err
		}
		l.cmd.Stderr = os.Stderr
		if err := l.cmd.Start(); err != nil {
			f.stop()
			return f, fmt.Errorf("start wsload: %w", err)
		}
		go l.read(out)
		f.procs = append(f.procs, l)
	}
	return f, nil
}

// read follows one wsload's output: the ramped line, then RESULT.
func (l *loader) read(out io.Reader) {
	defer close(l.done)
	var once sync.Once
	defer once.Do(func() { close(l.ramped) })
	sc := bufio.NewScanner(out)
	got := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "ramped "):
			once.Do(func() { close(l.ramped) })
		case strings.HasPrefix(line, "RESULT "):
			l.res, got = parseResult(line), true
		}
	}
	if err := l.cmd.Wait(); err != nil {
		l.err = fmt.Errorf("wsload %s: %w", l.prefix, err)
	} else if !got {
		l.err = fmt.Errorf("wsload %s: no RESULT line", l.prefix)
	}
}

func parseResult(line string) loadResult {
	var r loadResult
	for _, kv := range strings.Fields(strings.TrimPrefix(line, "RESULT ")) {
		k, v, _ := strings.Cut(kv, "=")
		n, _ := strconv.Atoi(v)
		switch k {
		case "conns":
			r.Conns = n
		case "failed":
			r.Failed = n
		case "dropped":
			r.Dropped = n
		case "closed":
			r.Closed = n
		case "pings":
			r.Pings = n
		case "pongs":
			r.Pongs = n
		case "guides":
			r.Guides = n
		case "guide_ids":
			r.GuideIDs = n
		}
	}
	return r
}

// waitRamped returns once every process has tried all its connections.
func (f *fleet) waitRamped(ctx context.Context) error {
	for _, l := range f.procs {
		select {
		case <-l.ramped:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// uid is the user of connection i of process p, and the gateway holding it.
func (f *fleet) uid(p, i int) (string, int) {
	return f.procs[p].prefix + "-" + strconv.Itoa(i), i % len(f.gwURLs)
}

// stop ends the hold (each wsload closes its connections normally) and
// returns the summed results. Later calls return the same, so a deferred
// stop is safe beside the one that reads the results.
func (f *fleet) stop() (loadResult, error) {
	f.stopOnce.Do(func() { f.res, f.err = f.stopAll() })
	return f.res, f.err
}

func (f *fleet) stopAll() (loadResult, error) {
	var sum loadResult
	var firstErr error
	for _, l := range f.procs {
		if l.cmd.Process != nil {
			l.cmd.Process.Signal(os.Interrupt)
		}
	}
	for _, l := range f.procs {
		select {
		case <-l.done:
		case <-time.After(60 * time.Second):
			killGroup(l.cmd)
			<-l.done
		}
		sum.add(l.res)
		if l.err != nil && firstErr == nil {
			firstErr = l.err
		}
	}
	return sum, firstErr
}

// pids are the wsload processes, for their CPU and memory.
func (f *fleet) pids() []int {
	var out []int
	for _, l := range f.procs {
		out = append(out, l.cmd.Process.Pid)
	}
	return out
}
