package helm

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// canaryValues are the chart's canary values the tests read.
type canaryValues struct {
	Enabled     bool     `json:"enabled"`
	URL         string   `json:"url"`
	Segment     string   `json:"segment"`
	TTL         string   `json:"ttl"`
	StageDelays []string `json:"stageDelays"`
	FeedStayers int      `json:"feedStayers"`
	FeedLeavers int      `json:"feedLeavers"`
	Dashboard   struct {
		Enabled bool `json:"enabled"`
	} `json:"dashboard"`
}

// canaryRules are the recording rules and alerts the canary's SLO needs.
var (
	canaryRecords = []string{"stillthere:canary_on_time:ratio_rate5m", "stillthere:canary_on_time:ratio_rate30m",
		"stillthere:canary_on_time:ratio_rate1h", "stillthere:canary_on_time:ratio_rate6h"}
	canaryAlerts = map[string]string{
		"StillthereCanaryBudgetBurnFast": "critical",
		"StillthereCanaryBudgetBurnSlow": "warning",
		"StillthereCanaryPromiseBroken":  "critical",
	}
)

// checkCanary: with canary.enabled, a Deployment runs "gateway canary"
// with the canary segment's settings and the token secret, behind a
// Service the ServiceMonitor scrapes; the PrometheusRule (when on) has its
// recording rules and burn-rate alerts; the dashboard ConfigMap (when on)
// carries Grafana's label and a dashboard that decodes. Off, none of it.
func checkCanary(t *testing.T, m *manifests, v values) {
	name := fullname + "-canary"
	d := m.deployments[name]
	if !v.Canary.Enabled {
		if d != nil || m.services[name] != nil || m.configMaps[name] != nil || m.configMaps[name+"-dashboard"] != nil {
			t.Error("canary parts rendered with canary.enabled false")
		}
		if r := m.rules[fullname]; r != nil {
			for _, g := range r.Spec.Groups {
				if g.Name == "stillthere-canary" {
					t.Error("the canary's rules rendered with canary.enabled false")
				}
			}
		}
		return
	}
	if d == nil {
		t.Fatalf("no Deployment %s", name)
	}
	if r := *d.Spec.Replicas; r != 1 {
		t.Errorf("%d canaries, want 1", r)
	}
	ctr := &d.Spec.Template.Spec.Containers[0]
	checkPod(t, m, "canary", &d.Spec.Template)
	envs := env(t, m, ctr)
	for k, want := range map[string]string{
		"STILLTHERE_CANARY_SEGMENT": v.Canary.Segment,
		"STILLTHERE_CANARY_TTL":     v.Canary.TTL,
		"STILLTHERE_TOKEN_SECRET":   "secret:" + secretName(v) + "/token-secret",
	} {
		if got := setting(t, envs, k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if got, want := setting(t, envs, "STILLTHERE_CANARY_STAGE_DELAYS"), strings.Join(v.Canary.StageDelays, ","); got != want {
		t.Errorf("STILLTHERE_CANARY_STAGE_DELAYS = %q, want %q", got, want)
	}
	if url := setting(t, envs, "STILLTHERE_CANARY_URL"); v.Canary.URL != "" && url != v.Canary.URL {
		t.Errorf("STILLTHERE_CANARY_URL = %q, want %q", url, v.Canary.URL)
	}
	feed := v.Canary.FeedStayers+v.Canary.FeedLeavers > 0
	if _, ok := envs["STILLTHERE_ACTIVITY_SECRET"]; ok != feed {
		t.Errorf("activity secret given: %v, want %v (users fed by the activity endpoint)", ok, feed)
	}
	if feed && !strings.HasSuffix(setting(t, envs, "STILLTHERE_CANARY_ACTIVITY_URL"), "-gateway-internal."+namespace+".svc:8081/v1/activity") {
		t.Errorf("STILLTHERE_CANARY_ACTIVITY_URL = %q, want the gateway's internal Service", envs["STILLTHERE_CANARY_ACTIVITY_URL"])
	}
	svc := m.services[name]
	if svc == nil || svc.Labels["stillthere.io/metrics"] != "true" || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "internal" }) {
		t.Errorf("Service %s: want one with an internal port that the ServiceMonitor scrapes", name)
	}
	for _, sm := range m.monitors {
		if !selects(t, &sm.Spec.Selector, svc.Labels) {
			t.Errorf("ServiceMonitor %s does not select the canary's Service", sm.Name)
		}
	}

	if v.PrometheusRule.Enabled {
		found := map[string]string{}
		for _, g := range m.rules[fullname].Spec.Groups {
			for _, r := range g.Rules {
				if g.Name == "stillthere-canary" {
					found[r.Record+r.Alert] = r.Labels["severity"]
				}
			}
		}
		for _, rec := range canaryRecords {
			if _, ok := found[rec]; !ok {
				t.Errorf("no recording rule %s", rec)
			}
		}
		for a, sev := range canaryAlerts {
			if got, ok := found[a]; !ok || got != sev {
				t.Errorf("alert %s: severity %q (present %v), want %q", a, got, ok, sev)
			}
		}
	}

	dash := m.configMaps[name+"-dashboard"]
	if !v.Canary.Dashboard.Enabled {
		if dash != nil {
			t.Error("dashboard rendered with canary.dashboard.enabled false")
		}
		return
	}
	if dash == nil || dash.Labels["grafana_dashboard"] != "1" {
		t.Fatalf("no dashboard ConfigMap with grafana_dashboard: \"1\"")
	}
	var board struct {
		UID    string            `json:"uid"`
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal([]byte(dash.Data["stillthere-canary.json"]), &board); err != nil || board.UID == "" || len(board.Panels) == 0 {
		t.Errorf("dashboard: %v, uid %q, %d panels", err, board.UID, len(board.Panels))
	}
}

// secretName is the Secret the pods read.
func secretName(v values) string {
	if v.Secrets.ExistingSecret != "" {
		return v.Secrets.ExistingSecret
	}
	return fullname
}

// TestChartRefusesBadCanaryValues: a canary that could not judge anything
// right fails the render, naming why.
func TestChartRefusesBadCanaryValues(t *testing.T) {
	on := []string{"--set", "canary.enabled=true"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"webhook sender", []string{"--set", "consumer.sender=webhook", "--set", "consumer.webhookURL=https://im.example.com/hook",
			"--set", "secrets.webhookSecret=webhook-secret-for-tests-0123456789"},
			[]string{"canary.enabled: needs consumer.sender=gateway"}},
		{"feed users without an activity secret", []string{"--set", "canary.feedLeavers=1"},
			[]string{"canary.feedStayers, canary.feedLeavers", "secrets.activitySecret"}},
		{"objective of 1", []string{"--set", "canary.slo.objective=1"}, []string{"/canary/slo/objective"}},
		{"URL not a WebSocket", []string{"--set", "canary.url=https://chat.example.com"}, []string{"/canary/url"}},
		{"TTL not a duration", []string{"--set-string", "canary.ttl=30"}, []string{"/canary/ttl"}},
		{"URL through extraEnv", []string{"--set", "canary.extraEnv[0].name=STILLTHERE_CANARY_URL", "--set", "canary.extraEnv[0].value=ws://x"},
			[]string{"canary.extraEnv", "STILLTHERE_CANARY_URL"}},
		{"misspelt key", []string{"--set", "canary.stayer=3"}, []string{"/canary", "stayer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, slices.Concat(secretValues, on, tc.args)...)
			if err == nil {
				t.Fatalf("helm template %q succeeded, want an error naming %q", tc.args, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}
