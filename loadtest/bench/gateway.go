package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// secrets are shared by every gateway of a run, as in a deployment: any
// instance verifies any client's token and takes any push.
type secrets struct{ token, push string }

// gateway is one gateway process of the run.
type gateway struct {
	id       string
	cmd      *exec.Cmd
	done     chan struct{}
	addr     string // public WebSocket listener
	pushAddr string // push, metrics, pprof (turned on)
	logs     *logTally
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// readModeEnv picks how a gateway reads its connections (epoll or
// goroutine). A gateway without the setting ignores it: it reads with a
// goroutine per connection, and gatewayReadModes says so.
const readModeEnv = "STILLTHERE_READ_MODE"

// gatewayReadModes reports whether the gateway built in bin has the read
// mode setting.
func gatewayReadModes(ctx context.Context, bin string) bool {
	return flagsOf(ctx, bin, "gateway")["read-mode"]
}

// startGateway starts a gateway with the run's settings, and env after
// them (NAME=value), and waits until it is ready.
func startGateway(ctx context.Context, bin, redisAddr, id string, s secrets, env ...string) (*gateway, error) {
	g := &gateway{id: id, done: make(chan struct{})}
	var err error
	if g.addr, err = freeAddr(); err != nil {
		return nil, err
	}
	if g.pushAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	g.cmd = command(ctx, 20*time.Second, filepath.Join(bin, "gateway"))
	g.cmd.Env = append(os.Environ(),
		"STILLTHERE_REDIS_ADDRS="+redisAddr,
		"STILLTHERE_GATEWAY_ADDR="+g.addr,
		"STILLTHERE_PUSH_ADDR="+g.pushAddr,
		"STILLTHERE_TOKEN_SECRET="+s.token,
		"STILLTHERE_PUSH_SECRET="+s.push,
		"STILLTHERE_INSTANCE_ID="+id,
		"STILLTHERE_LOG_LEVEL=warn",
		"STILLTHERE_KEY_PREFIX=bench",
		// The report holds a heap profile of a gateway under load.
		"STILLTHERE_PPROF=true",
	)
	g.cmd.Env = append(g.cmd.Env, env...)
	g.logs = newLogTally(os.Stderr, 3)
	g.cmd.Stderr = g.logs
	if err := g.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start gateway %s: %w", id, err)
	}
	go func() { g.cmd.Wait(); close(g.done) }()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + g.pushAddr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return g, nil
			}
		}
		select {
		case <-g.done:
			return nil, fmt.Errorf("gateway %s exited before it was ready: %v", id, g.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			g.stop()
			return nil, fmt.Errorf("gateway %s not ready within 15s", id)
		}
	}
}

func (g *gateway) url() string { return "ws://" + g.addr + "/v1/ws" }
func (g *gateway) pid() int    { return g.cmd.Process.Pid }

// stop drains the gateway with SIGTERM, as in a deployment.
func (g *gateway) stop() { terminate(g.cmd, g.done, 30*time.Second) }

// metrics reads the gateway's /metrics: each sample under its full name
// with labels, and each metric's sum over its label sets under its bare
// name.
func (g *gateway) metrics() map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get("http://" + g.pushAddr + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		name := f[0]
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		out[name] += v
		if name != f[0] {
			out[f[0]] = v
		}
	}
	return out
}

// push asks this gateway to deliver one guide, and returns its status
// ("delivered", "queued", "duplicate") and the connections it reached.
func (g *gateway) push(ctx context.Context, s secrets, id, uid string) (string, int, error) {
	body, _ := json.Marshal(map[string]string{"id": id, "uid": uid, "text": "Are you still there?"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.pushAddr+"/v1/push", bytes.NewReader(body))
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Authorization", "Bearer "+s.push)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status      string `json:"status"`
		Connections int    `json:"connections"`
	}
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("push %s via %s: %s", uid, g.id, resp.Status)
		if resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusServiceUnavailable {
			err = &retryPush{err}
		}
		return "", 0, err
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return "", 0, fmt.Errorf("push %s via %s: %w", uid, g.id, err)
	}
	return r.Status, r.Connections, nil
}

// retryPush is a push the gateway asked to have sent again, as the guide
// consumer does: 409, an instance in the user's route paused or missing
// heartbeats (a starved process), or 503.
type retryPush struct{ error }

// pushRetrying pushes as push does, sending again what the gateway asks
// to have sent again, each a little later, for up to a quarter minute.
// retries counts the sends again.
func (g *gateway) pushRetrying(ctx context.Context, s secrets, id, uid string) (status string, conns, retries int, err error) {
	wait := 100 * time.Millisecond
	for giveUp := time.Now().Add(15 * time.Second); ; retries++ {
		status, conns, err = g.push(ctx, s, id, uid)
		var rp *retryPush
		if !errors.As(err, &rp) || time.Now().After(giveUp) {
			return status, conns, retries, err
		}
		sleep(ctx, wait)
		if ctx.Err() != nil {
			return status, conns, retries, err
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// heapTop is `go tool pprof -top` of the gateway's in-use heap, cut to
// the first lines.
func (g *gateway) heapTop(ctx context.Context, lines int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-sample_index=inuse_space",
		"http://"+g.pushAddr+"/debug/pprof/heap")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %w", err)
	}
	all := strings.Split(strings.TrimSpace(string(out)), "\n")
	var keep []string
	for _, l := range all {
		// Drop the lines naming the fetched profile's temporary file.
		if strings.HasPrefix(l, "Fetching") || strings.HasPrefix(l, "Saved profile") {
			continue
		}
		keep = append(keep, l)
		if len(keep) >= lines {
			break
		}
	}
	return strings.Join(keep, "\n"), nil
}
