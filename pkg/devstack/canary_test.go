package devstack

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

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
// consumer stopped, no stage is delivered, and the canary's metrics show
// lost stages.
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
	before := canaryMetrics(t, c)
	waitCond(t, 90*time.Second, "the canary to judge 4 stages ok", func() bool {
		return stageCount(since(before, canaryMetrics(t, c)), "ok") >= 4
	})
	if m := since(before, canaryMetrics(t, c)); stageCount(m, "lost") != 0 {
		t.Fatalf("%v stages lost with the consumer running; metrics moved by %v", stageCount(m, "lost"), m)
	}

	p.mu.Lock()
	consumer := p.consumer
	p.mu.Unlock()
	if err := consumer.Stop(); err != nil {
		t.Fatal(err)
	}
	p.log.Info("test: consumer stopped")
	stopped := canaryMetrics(t, c)
	var m map[string]float64
	waitCond(t, 90*time.Second, "the canary to judge 3 stages lost", func() bool {
		m = since(stopped, canaryMetrics(t, c))
		return stageCount(m, "lost") >= 3
	})
	for _, class := range []string{"false", "duplicated", "disordered", "spam"} {
		if n := stageCount(m, class); n != 0 {
			t.Errorf("%v stages %s with the consumer stopped, want none; metrics moved by %v", n, class, m)
		}
	}
}
