package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"
)

// outageScale sizes step 6.
type outageScale struct {
	Active, Silent int
	TTL, Jitter    time.Duration
	Grace          time.Duration
	Faults         string        // comma-separated, in order
	Limit          time.Duration // the most outagebench may take
}

// OutageFault is one fault's row of outagebench's output.
type OutageFault struct {
	Fault             string         `json:"fault"`
	What              string         `json:"what"`
	DownMS            float64        `json:"down_ms"`
	Active            int            `json:"active"`
	ActiveGuided      int            `json:"active_guided"`
	ActiveGuidedShare float64        `json:"active_guided_share"`
	Silent            int            `json:"silent"`
	GuidedOnce        int            `json:"guided_once"`
	Lost              int            `json:"lost"`
	Doubled           int            `json:"doubled"`
	Early             int            `json:"guided_early"`
	Affected          int            `json:"affected"`
	ExtraP50ms        float64        `json:"extra_delay_p50_ms"`
	ExtraP99ms        float64        `json:"extra_delay_p99_ms"`
	ExtraMaxms        float64        `json:"extra_delay_max_ms"`
	OthersP99ms       float64        `json:"others_latency_p99_ms"`
	Held              map[string]int `json:"held"`
	Blind             []string       `json:"blind_intervals"`
	Logs              []string       `json:"logs"`
	Dials             int            `json:"dials"`
	Evidence          []string       `json:"evidence,omitempty"`
}

// wrong reports whether a user was guided while there, or a silent one
// lost or doubled.
func (f OutageFault) wrong() bool {
	return f.ActiveGuided > 0 || f.Early > 0 || f.Lost > 0 || f.Doubled > 0 || f.GuidedOnce+f.Lost+f.Doubled < f.Silent
}

// Outage is step 6, as outagebench prints it.
type Outage struct {
	Command     string        `json:"command"`
	Gateways    int           `json:"gateways"`
	Active      int           `json:"active"`
	Silent      int           `json:"silent_per_fault"`
	TTLMS       float64       `json:"ttl_ms"`
	JitterMS    float64       `json:"jitter_ms"`
	PingEveryMS float64       `json:"ping_every_ms"`
	GraceMS     float64       `json:"grace_ms"`
	OutageMS    float64       `json:"outage_ms"`
	Faults      []OutageFault `json:"faults"`
	Posts       int           `json:"webhook_posts"`
	Distinct    int           `json:"webhook_distinct"`
}

// outage runs outagebench against the gateway binary of bin.
func outage(ctx context.Context, bin string, sc outageScale) (*Outage, error) {
	args := []string{"-gateway", filepath.Join(bin, "gateway"),
		"-active", strconv.Itoa(sc.Active), "-silent", strconv.Itoa(sc.Silent),
		"-ttl", sc.TTL.String(), "-jitter", sc.Jitter.String(), "-grace", sc.Grace.String(),
		"-faults", sc.Faults}
	o := &Outage{}
	fmt.Printf("outage: %d active users and %d silent per fault, TTL %v, grace %v; faults %s\n",
		sc.Active, sc.Silent, sc.TTL, sc.Grace, sc.Faults)
	err := runJSON(ctx, sc.Limit, o, bin, "outagebench", args...)
	// The command that reproduces it, from the repository root.
	args[1] = "bin/gateway"
	o.Command = commandLine("outagebench", args...)
	if err == nil && len(o.Faults) == 0 {
		err = fmt.Errorf("outagebench printed no fault")
	}
	return o, err
}
