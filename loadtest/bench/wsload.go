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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stillthere/stillthere/loadtest/latency"
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
	cmd     *exec.Cmd
	prefix  string
	conns   int
	ramped  chan struct{}
	pinging chan struct{} // closed on the "pinging" line, after -idle
	tried   atomic.Int64  // connections dialed so far, from the "ramping" lines
	marks   chan pongFigures
	done    chan struct{}
	res     loadResult
	err     error
}

// loadResult is a wsload RESULT line, or the sum of several.
type loadResult struct {
	Conns, Failed, Dropped, Closed, Pings, Pongs, Guides, GuideIDs int
	// Ping→pong since the last mark (or the start).
	pongFigures
}

// pongFigures are ping→pong times over PongN pings answered. Summed
// figures take their percentiles from the merged histogram, so they are
// those of every process's samples together.
type pongFigures struct {
	PongN                                       int
	PongP50ms, PongP99ms, PongP999ms, PongMaxms float64
	hist                                        *latency.Histogram
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
	r.pongFigures.add(o.pongFigures)
}

func (r *pongFigures) add(o pongFigures) {
	r.PongN += o.PongN
	switch {
	case o.hist == nil:
		// A wsload that prints no histogram: the worst of the
		// processes' percentiles is the most that can be said.
		r.PongP50ms, r.PongP99ms = max(r.PongP50ms, o.PongP50ms), max(r.PongP99ms, o.PongP99ms)
		r.PongP999ms, r.PongMaxms = max(r.PongP999ms, o.PongP999ms), max(r.PongMaxms, o.PongMaxms)
		return
	case r.hist == nil:
		r.hist = &latency.Histogram{}
	}
	r.hist.Merge(o.hist)
	ms := func(q float64) float64 { return float64(r.hist.Quantile(q).Microseconds()) / 1000 }
	r.PongP50ms, r.PongP99ms, r.PongP999ms, r.PongMaxms = ms(0.5), ms(0.99), ms(0.999), ms(1)
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
	// readMode is wsload's -read-mode; "" leaves its default.
	readMode string
	// idle: once up, the connections hold this long before they ping.
	idle time.Duration
	// env is added to each process's environment.
	env []string
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
		l := &loader{prefix: spec.tag + strconv.Itoa(p), conns: n, ramped: make(chan struct{}), pinging: make(chan struct{}),
			marks: make(chan pongFigures, 4), done: make(chan struct{})}
		args := []string{"-url", strings.Join(urls, ","), "-secret", s.token, "-conns", strconv.Itoa(n),
			"-every", spec.every.String(), "-hold", spec.maxHold.String(),
			"-ramp", strconv.Itoa(max(spec.ramp/spec.procs, 1)),
			"-leave-over", spec.leave.String(), "-uid-prefix", l.prefix, "-local-ips", strings.Join(ips, ",")}
		if spec.readMode != "" {
			args = append(args, "-read-mode", spec.readMode)
		}
		if spec.idle > 0 {
			args = append(args, "-idle", spec.idle.String())
		}
		l.cmd = command(ctx, 30*time.Second, filepath.Join(bin, "wsload"), args...)
		out, err := l.cmd.StdoutPipe()
		if err != nil {
			return f, err
		}
		l.cmd.Stderr = os.Stderr
		if len(spec.env) > 0 {
			l.cmd.Env = append(os.Environ(), spec.env...)
		}
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
	var ramped, pinging sync.Once
	defer ramped.Do(func() { close(l.ramped) })
	defer pinging.Do(func() { close(l.pinging) })
	sc := bufio.NewScanner(out)
	// A RESULT line carries a histogram of a few thousand characters.
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	got := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "ramping "):
			r := parseResult(line)
			l.tried.Store(int64(r.Conns + r.Failed))
		case strings.HasPrefix(line, "ramped "):
			ramped.Do(func() { close(l.ramped) })
		case line == "pinging":
			pinging.Do(func() { close(l.pinging) })
		case strings.HasPrefix(line, "mark "):
			select {
			case l.marks <- parseResult(line).pongFigures:
			default: // nobody asked for it
			}
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

// parseResult reads a RESULT line. Fields it does not know are skipped,
// and a figure that does not parse reads as 0, so that a wsload older or
// newer than this bench still reports what both know.
func parseResult(line string) loadResult {
	var r loadResult
	for _, kv := range strings.Fields(strings.TrimPrefix(line, "RESULT ")) {
		k, v, _ := strings.Cut(kv, "=")
		n, _ := strconv.Atoi(v)
		f, _ := strconv.ParseFloat(v, 64)
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
		case "pong_n":
			r.PongN = n
		case "pong_p50_ms":
			r.PongP50ms = f
		case "pong_p99_ms":
			r.PongP99ms = f
		case "pong_p999_ms":
			r.PongP999ms = f
		case "pong_max_ms":
			r.PongMaxms = f
		case "pong_hist":
			if h, err := latency.Parse(v); err == nil {
				r.hist = h
			}
		}
	}
	return r
}

// rampStall is how long a ramp may go without a connection dialed
// before waitRamped gives up on it. A busy machine slows a ramp; this
// tells that from a stuck one.
const rampStall = time.Minute

// waitRamped returns once every process has tried all its connections,
// or fails when none has dialed one for rampStall.
func (f *fleet) waitRamped(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, moved := int64(-1), time.Now()
	for {
		var tried int64
		done := true
		for _, l := range f.procs {
			select {
			case <-l.ramped:
				tried += int64(l.conns)
			default:
				tried += l.tried.Load()
				done = false
			}
		}
		if done {
			return nil
		}
		if tried != last {
			last, moved = tried, time.Now()
		} else if time.Since(moved) > rampStall {
			return fmt.Errorf("no connection dialed for %v, %d of %d dialed", rampStall, tried, f.conns())
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("%w, %d of %d dialed", ctx.Err(), tried, f.conns())
		}
	}
}

// conns is the number of connections the fleet was asked for.
func (f *fleet) conns() int {
	n := 0
	for _, l := range f.procs {
		n += l.conns
	}
	return n
}

// waitPinging returns once every process's connections ping (after -idle).
func (f *fleet) waitPinging(ctx context.Context) error {
	return f.waitAll(ctx, func(l *loader) <-chan struct{} { return l.pinging })
}

func (f *fleet) waitAll(ctx context.Context, ch func(*loader) <-chan struct{}) error {
	for _, l := range f.procs {
		select {
		case <-ch(l):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// mark starts every process's ping→pong figures afresh (SIGUSR1) and
// returns those of the period it ends, summed: two marks bound a window.
func (f *fleet) mark(ctx context.Context) (pongFigures, error) {
	var sum pongFigures
	for _, l := range f.procs {
		for len(l.marks) > 0 {
			<-l.marks // an answer nobody waited for
		}
		if l.cmd.Process != nil {
			l.cmd.Process.Signal(syscall.SIGUSR1)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, l := range f.procs {
		select {
		case p := <-l.marks:
			sum.add(p)
		case <-l.done:
			return sum, fmt.Errorf("wsload %s ended before its mark", l.prefix)
		case <-ctx.Done():
			return sum, fmt.Errorf("wsload %s: no mark: %w", l.prefix, ctx.Err())
		}
	}
	return sum, nil
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
