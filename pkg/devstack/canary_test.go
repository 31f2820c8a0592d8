package devstack

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/stillthere/stillthere/pkg/activity"
	"github.com/stillthere/stillthere/pkg/canary"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// The canary's tests: short cycles (a TTL of 3s, a close 2s after the
// reminder), judged every 300ms. The canary's metrics are the process's
// (package-level, as every service's), so each test reads how they moved
// from its start; these tests do not run in parallel.
const (
	canaryTTL   = 3 * time.Second
	canaryClose = 2 * time.Second
)

// canaryConfig is a canary of short cycles against the gateway at wsURL.
func canaryConfig(wsURL, tokenSecret string, jitter time.Duration) canary.Config {
	c := canary.DefaultConfig()
	c.URL = wsURL
	c.TokenSecret = tokenSecret
	c.TTL, c.Jitter = canaryTTL, jitter
	c.StageDelays = []time.Duration{canaryClose}
	c.Stayers, c.Leavers = 2, 3
	c.LeavePings = 2
	c.StayFor = 30 * time.Second
	c.Slack = 3 * time.Second
	c.AnswerTimeout = 2 * time.Second
	c.CheckInterval = 300 * time.Millisecond
	c.Window = 2 * time.Minute
	c.AdminAddr = "127.0.0.1:0"
	return c
}

// startCanary opens and runs a canary, stopped at cleanup.
func startCanary(t *testing.T, cfg canary.Config) *canary.Canary {
	t.Helper()
	c, err := canary.Open(context.Background(), cfg, serviceLog(t).With("service", "canary"))
	if err != nil {
		t.Fatalf("open canary: %v", err)
	}
	lifecycletest.Run(t, "canary", c)
	return c
}

// canaryMetrics scrapes the canary's /metrics: every sample of the
// stillthere_canary_ series, by its name and labels as written.
func canaryMetrics(t testing.TB, c *canary.Canary) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + c.AdminAddr().String() + "/metrics")
	if err != nil {
		t.Fatalf("scrape canary: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "stillthere_canary_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	io.Copy(io.Discard, resp.Body)
	return out
}

// stageCount is the count of stages of class in m.
func stageCount(m map[string]float64, class string) float64 {
	return m[`stillthere_canary_stages_total{class="`+class+`"}`]
}

// since is how far each series of now moved from before.
func since(before, now map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range now {
		out[k] = v - before[k]
	}
	return out
}

// TestCanaryOnDevStack runs the canary against the dev stack (make run's),
// with users of every kind, pings and the activity API: its metrics show
// stages on time, silences and signals of both ways, and nothing broken.
func TestCanaryOnDevStack(t *testing.T) {
	s := startStack(t, map[string]string{
		"STILLTHERE_SESSION_TTL": canaryTTL.String(),
		"STILLTHERE_CLOSE_AFTER": canaryClose.String(),
		"STILLTHERE_CLOSE_TEXT":  "We closed this chat.",
	})
	// The operator's step: the canary segment's TTL and stages (the same
	// as the stack's defaults here, so that no gateway runs on an older
	// read of the policy while the canary starts).
	tool := map[string]string{
		"STILLTHERE_REDIS_ADDRS":    s.RedisAddr,
		"STILLTHERE_KEY_PREFIX":     s.GatewayConfig.Redis.KeyPrefix,
		"STILLTHERE_SESSION_TTL":    canaryTTL.String(),
		"STILLTHERE_SESSION_JITTER": s.GatewayConfig.SessionJitter.String(),
		"STILLTHERE_CLOSE_AFTER":    canaryClose.String(),
		"STILLTHERE_CLOSE_TEXT":     "We closed this chat.",
	}
	env := func(k string) (string, bool) { v, ok := tool[k]; return v, ok }
	var out strings.Builder
	if err := policy.Command(context.Background(), []string{"set", "-segment", "canary=" + canaryTTL.String(),
		"-stages", `canary=[{}, {"after": "` + canaryClose.String() + `", "action": "close", "text": "We closed this chat."}]`}, env, &out); err != nil {
		t.Fatalf("policy set: %v\n%s", err, out.String())
	}

	cfg := canaryConfig(wsURL(s), s.TokenSecret, s.GatewayConfig.SessionJitter)
	cfg.FeedStayers, cfg.FeedLeavers = 1, 2
	cfg.ActivityURL = "http://" + s.Gateway.PushAddr().String() + activity.Path
	cfg.ActivitySecret = s.GatewayConfig.ActivitySecret
	c := startCanary(t, cfg)
	before := canaryMetrics(t, c)

	// Each leaver's cycle is two signals, the TTL, the reminder, the close
	// 2s later and the judge's settle time: about 12s.
	var m map[string]float64
	waitCond(t, 90*time.Second, "the canary to judge 10 stages ok", func() bool {
		m = since(before, canaryMetrics(t, c))
		return stageCount(m, "ok") >= 10
	})
	for _, class := range []string{"lost", "false", "duplicated", "disordered", "spam"} {
		if n := stageCount(m, class); n != 0 {
			t.Errorf("%v stages %s, want none; metrics moved by %v", n, class, m)
		}
	}
	for _, series := range []string{
		`stillthere_canary_silences_total{via="ping"}`,
		`stillthere_canary_silences_total{via="activity"}`,
		`stillthere_canary_signals_total{outcome="answered",via="ping"}`,
		`stillthere_canary_signals_total{outcome="answered",via="activity"}`,
		`stillthere_canary_guides_total{role="leaver"}`,
		`stillthere_canary_stage_lateness_seconds_count`,
	} {
		if m[series] <= 0 {
			t.Errorf("%s did not move; metrics moved by %v", series, m)
		}
	}
	if n := m[`stillthere_canary_guides_total{role="stayer"}`]; n != 0 {
		t.Errorf("stayers got %v guides, want none", n)
	}
	t.Logf("metrics moved by %v", m)
}

// TestCanaryConsumerStopped breaks a part on purpose: with the guide
// consumer stopped, no stage is delivered, the canary's metrics show lost
// stages, and the chart's fast burn-rate alert, fed those metrics, fires.
func TestCanaryConsumerStopped(t *testing.T) {
	p := newPipelineRig(t, pipelineOptions{Gateways: 1, Sender: guide.SenderGateway, Policy: &policy.Policy{
		DefaultTTL: faultTTL,
		Jitter:     faultJitter,
		Segments:   map[string]time.Duration{"canary": canaryTTL},
		SegmentStages: map[string][]policy.Stage{"canary": {
			{Action: timeoutevent.ActionRemind},
			{After: canaryClose, Action: timeoutevent.ActionClose, Text: "We closed this chat."},
		}},
	}})
	url := "ws://" + p.liveGateways()[0].gw.PublicAddr().String() + "/v1/ws"
	c := startCanary(t, canaryConfig(url, p.tokenSecret, faultJitter))
	s := &scrapes{c: c}
	s.scrape(t)
	before := s.last()
	s.until(t, 90*time.Second, "the canary to judge 4 stages ok", func(m map[string]float64) bool {
		return stageCount(since(before, m), "ok") >= 4
	})
	if m := since(before, s.last()); stageCount(m, "lost") != 0 {
		t.Fatalf("%v stages lost with the consumer running; metrics moved by %v", stageCount(m, "lost"), m)
	}

	p.mu.Lock()
	consumer := p.consumer
	p.mu.Unlock()
	if err := consumer.Stop(); err != nil {
		t.Fatal(err)
	}
	p.log.Info("test: consumer stopped")
	stoppedAt := len(s.samples) - 1
	stopped := s.last()
	s.until(t, 90*time.Second, "the canary to judge 3 stages lost", func(m map[string]float64) bool {
		return stageCount(since(stopped, m), "lost") >= 3
	})
	m := since(stopped, s.last())
	for _, class := range []string{"false", "duplicated", "disordered", "spam"} {
		if n := stageCount(m, class); n != 0 {
			t.Errorf("%v stages %s with the consumer stopped, want none; metrics moved by %v", n, class, m)
		}
	}
	// Two more scrapes: the alert's for is two evaluations.
	s.scrape(t)
	s.scrape(t)
	checkBurnAlert(t, s.samples, stoppedAt)
}

// scrapes are the canary's metrics, scraped once a second as a Prometheus
// would (each scrape stands for a minute of promtool's time).
type scrapes struct {
	c       *canary.Canary
	samples []map[string]float64
}

func (s *scrapes) scrape(t *testing.T) {
	t.Helper()
	if len(s.samples) > 0 {
		// The scrapes' pace, not a wait for the canary: they stand for
		// a Prometheus's scrape interval.
		time.Sleep(time.Second)
	}
	s.samples = append(s.samples, canaryMetrics(t, s.c))
}

func (s *scrapes) last() map[string]float64 { return s.samples[len(s.samples)-1] }

// until scrapes until cond holds of a scrape, for at most within.
func (s *scrapes) until(t *testing.T, within time.Duration, what string, cond func(map[string]float64) bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond(s.last()) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s; the last scrape: %v", within, what, s.last())
		}
		s.scrape(t)
	}
}

// checkBurnAlert feeds the canary's stage counters, as scraped, to the
// chart's recording rules and alerts (deploy/helm/stillthere/files/
// canary-rules.yaml, at a 99.9% objective) in promtool: the fast
// burn-rate alert does not fire before the consumer stopped (at scrape
// stoppedAt), and fires at the last scrape. It needs promtool (make rules
// installs it); without it, the check is skipped unless
// STILLTHERE_REQUIRE_PROMTOOL is set.
func checkBurnAlert(t *testing.T, samples []map[string]float64, stoppedAt int) {
	t.Helper()
	promtool := promtoolBinary(t)
	if promtool == "" {
		return
	}
	dir := t.TempDir()
	raw, err := os.ReadFile("../../deploy/helm/stillthere/files/canary-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var items []map[string]any
	if err := yaml.Unmarshal(raw, &items); err != nil {
		t.Fatal(err)
	}
	var rules []map[string]any
	for _, it := range items {
		expr := strings.NewReplacer("SEL", `namespace="chat"`, "BUDGET", "0.001").Replace(it["expr"].(string))
		if rec, ok := it["record"]; ok {
			rules = append(rules, map[string]any{"record": rec, "expr": expr})
			continue
		}
		r := map[string]any{"alert": it["alert"], "expr": expr, "labels": map[string]any{"severity": it["severity"]}}
		if f, ok := it["for"]; ok {
			r["for"] = f
		}
		rules = append(rules, r)
	}
	write := func(name string, v any) {
		b, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("rules.yaml", map[string]any{"groups": []any{map[string]any{"name": "stillthere-canary", "rules": rules}}})

	var series []any
	for _, class := range []string{"ok", "late", "lost", "false", "duplicated", "disordered", "indeterminate", "spam"} {
		var values []string
		for _, m := range samples {
			values = append(values, strconv.FormatFloat(stageCount(m, class), 'f', -1, 64))
		}
		series = append(series, map[string]any{
			"series": `stillthere_canary_stages_total{class="` + class + `",namespace="chat"}`,
			"values": strings.Join(values, " "),
		})
	}
	firing := `ALERTS{alertname="StillthereCanaryBudgetBurnFast",alertstate="firing"}`
	write("test.yaml", map[string]any{
		"rule_files":          []string{"rules.yaml"},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval":     "1m",
			"input_series": series,
			"promql_expr_test": []any{
				map[string]any{"expr": firing, "eval_time": fmt.Sprintf("%dm", stoppedAt), "exp_samples": []any{}},
				map[string]any{"expr": firing, "eval_time": fmt.Sprintf("%dm", len(samples)-1), "exp_samples": []any{map[string]any{
					"labels": `ALERTS{alertname="StillthereCanaryBudgetBurnFast",alertstate="firing",namespace="chat",severity="critical"}`,
					"value":  1,
				}}},
			},
		}},
	})
	cmd := exec.Command(promtool, "test", "rules", "test.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s\nthe scrapes (one a minute, the consumer stopped at %dm): %v", err, out, stoppedAt, series)
	}
}

// promtoolBinary finds promtool on PATH or in GOPATH/bin, where make rules
// installs it; "" when there is none and STILLTHERE_REQUIRE_PROMTOOL is
// not set.
func promtoolBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if gopath, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(gopath)), "bin", "promtool")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("STILLTHERE_REQUIRE_PROMTOOL") != "" {
		t.Fatal("promtool is not installed and STILLTHERE_REQUIRE_PROMTOOL is set: run make rules to install it")
	}
	t.Log("promtool is not installed: the burn-rate alert is not checked (make rules installs it)")
	return ""
}
