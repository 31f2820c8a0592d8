// Command bench measures the gateway as a separate process under load from
// wsload processes, against a child redis-server, and writes
// bench/report.md and bench/report.json:
//
//   - memory: gateway RSS per idle connection at the most connections one
//     instance holds (its open-file limit less headroom);
//   - renewals: Redis round trips per renewal at a target renewal rate.
//
// It expects the gateway and wsload binaries built into -bin (make bench
// does that). Every figure in the report comes with the command that
// reproduces it.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver"
)

type result struct {
	Machine           string  `json:"machine"`
	Command           string  `json:"command"`
	IdleConns         int     `json:"idle_conns"`
	IdleFailed        int     `json:"idle_failed"`
	RSSBaseMB         float64 `json:"rss_base_mb"`
	RSSLoadedMB       float64 `json:"rss_loaded_mb"`
	RSSPerConnKB      float64 `json:"rss_per_conn_kb"`
	HeapPerConnKB     float64 `json:"go_heap_per_conn_kb"`
	Goroutines        float64 `json:"goroutines_loaded"`
	RenewalConns      int     `json:"renewal_conns"`
	RenewalRate       float64 `json:"renewals_per_second"`
	RoundTrips        float64 `json:"round_trips"`
	Renewals          float64 `json:"renewals"`
	RoundTripsPerRen  float64 `json:"round_trips_per_renewal"`
	RenewalsPerTrip   float64 `json:"renewals_per_round_trip"`
	GatewayCPUSeconds float64 `json:"gateway_cpu_seconds_renewal_phase"`
}

func main() {
	bin := flag.String("bin", "bin", "directory with the gateway and wsload binaries")
	out := flag.String("out", "bench", "directory for report.md and report.json")
	idle := flag.Int("idle-conns", 0, "connections for the memory phase; 0 means the gateway's limit less 200")
	renewConns := flag.Int("renew-conns", 10000, "connections for the renewal phase")
	renewEvery := flag.Duration("renew-every", 2*time.Second, "ping interval in the renewal phase (conns/interval = renewals/s)")
	hold := flag.Duration("hold", 20*time.Second, "how long each phase holds its connections")
	flag.Parse()
	if err := run(*bin, *out, *idle, *renewConns, *renewEvery, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func secret() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func freeAddr() string {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	defer l.Close()
	return l.Addr().String()
}

type gateway struct {
	cmd      *exec.Cmd
	addr     string
	pushAddr string
}

func startGateway(bin, redisAddr, tokenSecret string) (*gateway, error) {
	g := &gateway{addr: freeAddr(), pushAddr: freeAddr()}
	g.cmd = exec.Command(filepath.Join(bin, "gateway"))
	g.cmd.Env = append(os.Environ(),
		"STILLTHERE_REDIS_ADDRS="+redisAddr,
		"STILLTHERE_GATEWAY_ADDR="+g.addr,
		"STILLTHERE_PUSH_ADDR="+g.pushAddr,
		"STILLTHERE_TOKEN_SECRET="+tokenSecret,
		"STILLTHERE_PUSH_SECRET="+secret(),
		"STILLTHERE_LOG_LEVEL=warn",
		"STILLTHERE_KEY_PREFIX=bench",
	)
	g.cmd.Stderr = os.Stderr
	if err := g.cmd.Start(); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + g.pushAddr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return g, nil
			}
		}
		if time.Now().After(deadline) {
			g.stop()
			return nil, fmt.Errorf("gateway not ready within 10s")
		}
	}
}

func (g *gateway) stop() {
	g.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { g.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		g.cmd.Process.Kill()
		<-done
	}
}

// rssKB reads VmRSS of pid.
func rssKB(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return n
		}
	}
	return 0
}

// metric sums a metric's samples (all label sets) from the gateway.
func (g *gateway) metric(name string) float64 {
	resp, err := http.Get("http://" + g.pushAddr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// load runs wsload processes, at most perProc connections each, and
// returns once they exit; ready is called when all have ramped.
func load(ctx context.Context, bin, url, tokenSecret string, conns, perProc int, every, hold time.Duration, tag string) (failed int, err error) {
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for i := 0; conns > 0; i++ {
		n := min(conns, perProc)
		conns -= n
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "wsload"),
			"-url", url, "-secret", tokenSecret, "-conns", strconv.Itoa(n),
			"-every", every.String(), "-hold", hold.String(), "-ramp", "3000",
			"-uid-prefix", tag+strconv.Itoa(i))
		var sb strings.Builder
		cmd.Stdout = &sb
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		cmds = append(cmds, cmd)
		outs = append(outs, &sb)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			return 0, fmt.Errorf("wsload: %w: %s", err, outs[i].String())
		}
		for _, line := range strings.Split(outs[i].String(), "\n") {
			if rest, ok := strings.CutPrefix(line, "RESULT "); ok {
				for _, kv := range strings.Fields(rest) {
					if v, ok := strings.CutPrefix(kv, "failed="); ok {
						n, _ := strconv.Atoi(v)
						failed += n
					}
				}
			}
		}
	}
	return failed, nil
}

func run(bin, out string, idle, renewConns int, renewEvery, hold time.Duration) error {
	ctx := context.Background()
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	if idle == 0 {
		idle = int(lim.Cur) - 1024 - 200 // the gateway's default limit, less margin
	}
	perProc := int(lim.Cur) - 500

	dir, _ := os.MkdirTemp("", "stillthere-bench-")
	defer os.RemoveAll(dir)
	rds, err := redisserver.Start(ctx, redisserver.Options{Dir: dir, Args: []string{"--maxclients", "50000"}})
	if err != nil {
		return err
	}
	defer rds.Close()
	tokenSecret := secret()
	r := result{
		Machine: fmt.Sprintf("%s/%s, %d cores, open-file limit %d, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), lim.Cur, runtime.Version()),
		Command: "make bench",
	}

	// Memory: idle connections (one ping each per 15s, the contract's
	// cadence), RSS before and after.
	g, err := startGateway(bin, rds.Addr, tokenSecret)
	if err != nil {
		return err
	}
	time.Sleep(time.Second)
	base := rssKB(g.cmd.Process.Pid)
	heapBase := g.metric("go_memstats_heap_inuse_bytes")
	fmt.Printf("memory phase: %d connections\n", idle)
	sample := make(chan [3]float64, 1)
	go func() {
		// Sample at the end of the hold, when every connection is up.
		time.Sleep(time.Duration(idle)*time.Second/3000 + hold - 5*time.Second)
		sample <- [3]float64{rssKB(g.cmd.Process.Pid), g.metric("go_memstats_heap_inuse_bytes"), g.metric("go_goroutines")}
	}()
	failed, err := load(ctx, bin, "ws://"+g.addr+"/v1/ws", tokenSecret, idle, perProc, 15*time.Second, hold, "idle")
	if err != nil {
		g.stop()
		return err
	}
	s := <-sample
	g.stop()
	r.IdleConns, r.IdleFailed = idle, failed
	held := float64(idle - failed)
	r.RSSBaseMB, r.RSSLoadedMB = base/1024, s[0]/1024
	r.RSSPerConnKB = (s[0] - base) / held
	r.HeapPerConnKB = (s[1] - heapBase) / 1024 / held
	r.Goroutines = s[2]

	// Renewals: round trips per renewal at conns/interval renewals per second.
	g, err = startGateway(bin, rds.Addr, tokenSecret)
	if err != nil {
		return err
	}
	fmt.Printf("renewal phase: %d connections pinging every %v\n", renewConns, renewEvery)
	measure := make(chan [3]float64, 1)
	go func() {
		ramp := time.Duration(renewConns) * time.Second / 3000
		time.Sleep(ramp + renewEvery) // all up and pinging
		trips0, ren0 := g.metric("stillthere_gateway_renewal_round_trips_total"), g.metric("stillthere_gateway_renewals_total")
		cpu0 := g.metric("process_cpu_seconds_total")
		time.Sleep(hold - 2*renewEvery)
		measure <- [3]float64{g.metric("stillthere_gateway_renewal_round_trips_total") - trips0,
			g.metric("stillthere_gateway_renewals_total") - ren0, g.metric("process_cpu_seconds_total") - cpu0}
	}()
	if _, err := load(ctx, bin, "ws://"+g.addr+"/v1/ws", tokenSecret, renewConns, perProc, renewEvery, hold, "renew"); err != nil {
		g.stop()
		return err
	}
	m := <-measure
	g.stop()
	window := (hold - 2*renewEvery).Seconds()
	r.RenewalConns = renewConns
	r.RoundTrips, r.Renewals = m[0], m[1]
	r.RenewalRate = m[1] / window
	r.GatewayCPUSeconds = m[2]
	if m[1] > 0 {
		r.RoundTripsPerRen = m[0] / m[1]
	}
	if m[0] > 0 {
		r.RenewalsPerTrip = m[1] / m[0]
	}
	return write(out, r, renewEvery, hold)
}

func write(out string, r result, every, hold time.Duration) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "report.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	md := fmt.Sprintf(`# stillthere gateway benchmark

Machine: %s. Command: %s (raw figures in report.json).

## Memory per idle connection

%d connections held on one gateway process (%d failed), each pinging every 15 s.

| | |
|---|---|
| gateway RSS before | %.1f MB |
| gateway RSS with the connections | %.1f MB |
| RSS per connection | **%.2f KB** (goal: at most 10 KB) |
| Go heap in use per connection | %.2f KB |
| goroutines with the connections | %.0f |

## Renewal batching

%d connections pinging every %v for %v.

| | |
|---|---|
| renewals per second | **%.0f** |
| Redis round trips per renewal | **%.4f** (goal: at most 0.1 at 5k renewals/s) |
| renewals per round trip | %.1f |
| gateway CPU in the window | %.1f s |
`, r.Machine, r.Command, r.IdleConns, r.IdleFailed, r.RSSBaseMB, r.RSSLoadedMB, r.RSSPerConnKB, r.HeapPerConnKB, r.Goroutines,
		r.RenewalConns, every, hold, r.RenewalRate, r.RoundTripsPerRen, r.RenewalsPerTrip, r.GatewayCPUSeconds)
	if err := os.WriteFile(filepath.Join(out, "report.md"), []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Print(md)
	return nil
}
