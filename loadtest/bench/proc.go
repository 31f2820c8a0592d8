package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// command builds a child process in a process group of its own, which
// gets SIGKILL if bench dies and SIGTERM (then, after grace, SIGKILL to
// the whole group) when ctx ends. Its grandchildren (a redis-server that
// detectbench starts, say) go with the group.
func command(ctx context.Context, grace time.Duration, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = grace
	return cmd
}

// killGroup ends what is left of a child's process group.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// terminate sends SIGTERM to a child's group and waits for the child,
// killing the group after grace.
func terminate(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		killGroup(cmd)
		<-done
	}
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on every
// Linux platform Go supports.
const clockTicks = 100

// cpuSeconds is the user plus system CPU time pid has used so far.
func cpuSeconds(pid int) float64 {
	f := statFields(pid)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / clockTicks
}

// rssKB reads VmRSS of pid.
func rssKB(pid int) float64 {
	return procStatusKB(pid, "VmRSS:")
}

func procStatusKB(pid int, field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			n, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return n
		}
	}
	return 0
}

// Machine describes where the report was measured.
type Machine struct {
	CPUModel      string  `json:"cpu_model"`
	Cores         int     `json:"cores"`
	MemoryGiB     float64 `json:"memory_gib"`
	Kernel        string  `json:"kernel"`
	OS            string  `json:"os"`
	Go            string  `json:"go"`
	OpenFileLimit uint64  `json:"open_file_limit"`
	PortRange     string  `json:"ephemeral_port_range"`
	// RedisNice is the priority of steps 1, 2 and 7's redis-server
	// (redisNice, if it could take it).
	RedisNice int `json:"redis_nice"`
}

// processNice is the nice value of process pid, from /proc; 0 when
// unknown.
func processNice(pid string) int {
	id, err := strconv.Atoi(pid)
	if err != nil {
		return 0
	}
	f := statFields(id)
	if len(f) < 17 {
		return 0
	}
	n, _ := strconv.Atoi(f[16])
	return n
}

// statFields are the fields of /proc/<pid>/stat after the command name,
// which may hold spaces, in parens; nil when unreadable.
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

func machine() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	m.OpenFileLimit = lim.Cur
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		m.PortRange = strings.Join(strings.Fields(string(b)), "-")
	}
	m.MemoryGiB = procFileKB("/proc/meminfo", "MemTotal:") / (1 << 20)
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return m
}

func procFileKB(path, field string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			n, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return n
		}
	}
	return 0
}
