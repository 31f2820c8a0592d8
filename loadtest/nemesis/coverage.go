package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// scrapeEvery is how often the services' metrics are read. A process
// killed loses what it counted since its last scrape.
const scrapeEvery = time.Second

// path is one of the mechanisms the run must reach, by the counters that
// show it ran. Counters are summed over every start of every service of
// its kind.
type path struct {
	name   string
	kind   string // the services that count it
	metric string
	label  string // a label pair the samples must hold, or "" for all
}

var paths = []path{
	{name: "hold (any rule)", kind: "listener", metric: "stillthere_listener_held_total"},
	{name: "mass-expiry brake", kind: "listener", metric: "stillthere_listener_held_total", label: `rule="mass-expiry"`},
	{name: "deferred minute", kind: "listener", metric: "stillthere_listener_held_total", label: `rule="minute"`},
	{name: "spool replay", kind: "listener", metric: "stillthere_listener_replayed_total"},
	{name: "stale mark", kind: "consumer", metric: "stillthere_consumer_guides_total", label: `outcome="stale"`},
	{name: "resync", kind: "gateway", metric: "stillthere_gateway_resynced_total"},
}

// rebalancePath is counted by kfake's group joins past the first ones.
const rebalancePath = "rebalance"

// sample sums the samples of metric in a Prometheus text exposition
// whose labels hold label ("" for any).
func sample(text io.Reader, metric, label string) float64 {
	sum := 0.0
	sc := bufio.NewScanner(text)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric) {
			continue
		}
		rest := line[len(metric):]
		labels := ""
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // another metric whose name this one begins
		}
		if label != "" && !strings.Contains(labels, label) {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// coverage keeps the latest scraped value of each path per start of each
// service.
type coverage struct {
	mu   sync.Mutex
	last map[string]map[string]float64 // "listener-0#2" -> path -> value
}

func newCoverage() *coverage { return &coverage{last: map[string]map[string]float64{}} }

// scrape reads every running service's metrics once.
func (c *coverage) scrape(ctx context.Context, r *rig) {
	client := &http.Client{Timeout: time.Second}
	for _, s := range r.services() {
		if !s.up() {
			continue
		}
		gen := s.generation()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.admin+"/metrics", nil)
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			continue
		}
		vals := map[string]float64{}
		for _, p := range paths {
			if p.kind == s.kind {
				vals[p.name] = sample(strings.NewReader(string(body)), p.metric, p.label)
			}
		}
		c.mu.Lock()
		c.last[fmt.Sprintf("%s#%d", s.name, gen)] = vals
		c.mu.Unlock()
	}
}

// run scrapes until ctx ends.
func (c *coverage) run(ctx context.Context, r *rig) {
	t := time.NewTicker(scrapeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.scrape(ctx, r)
		}
	}
}

// totals sums each path over every start.
func (c *coverage) totals() map[string]float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]float64{}
	for _, p := range paths {
		out[p.name] = 0
	}
	for _, vals := range c.last {
		for k, v := range vals {
			out[k] += v
		}
	}
	return out
}

// missed names the paths that never ran.
func missed(totals map[string]float64) []string {
	var out []string
	for _, p := range append(paths, path{name: rebalancePath}) {
		if totals[p.name] <= 0 {
			out = append(out, p.name)
		}
	}
	return out
}
