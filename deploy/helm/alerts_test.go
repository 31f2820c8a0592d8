package helm

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stillthere/stillthere/deploy/metricnames"
)

// requiredAlerts are the alerts docs/operations.md's Alerts table leads
// with, by the series each must query and the severity it must carry.
var requiredAlerts = map[string]struct{ series, severity string }{
	"StillthereGuidesLate":           {"stillthere_consumer_deadline_to_delivery_seconds_bucket", "warning"},
	"StillthereProduceErrors":        {"stillthere_listener_produce_errors_total", "warning"},
	"StillthereSpoolBacklog":         {"stillthere_listener_spool_events", "warning"},
	"StillthereBreakerOpen":          {"stillthere_consumer_breaker_state", "critical"},
	"StillthereRenewalErrors":        {"stillthere_gateway_renewals_total", "critical"},
	"StillthereHeartbeatErrors":      {"stillthere_gateway_heartbeats_total", "warning"},
	"StillthereMassExpiryBrake":      {"stillthere_listener_mass_expiry_brake", "warning"},
	"StillthereGatewayFleetDown":     {"stillthere_listener_gateway_fleet_down", "critical"},
	"StillthereOutageHolds":          {"stillthere_listener_held_total", "info"},
	"StillthereActivityFeedLag":      {"stillthere_activity_feed_lag_seconds", "warning"},
	"StillthereActivityDeadLettered": {"stillthere_activity_feed_records_total", "warning"},
}

var (
	severities = []string{"critical", "warning", "info"}
	alertName  = regexp.MustCompile(`^Stillthere[A-Z][A-Za-z]+$`)
	// promDuration is the pattern of the Prometheus operator's Duration.
	promDuration = regexp.MustCompile(`^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`)
	labelRef     = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	// recordName is a recording rule's name, level:metric:operations.
	recordName = regexp.MustCompile(`^stillthere:[a-z0-9_]+:[a-z0-9_]+$`)
	recordRef  = regexp.MustCompile(`\bstillthere:[a-z0-9_]+:[a-z0-9_]+\b`)
)

// checkPrometheusRule: with prometheusRule.enabled, one PrometheusRule
// whose alerts each query series the services publish, scoped by the
// configured matchers, with a severity, a summary and a description.
func checkPrometheusRule(t *testing.T, m *manifests, v values) {
	if !v.PrometheusRule.Enabled {
		if len(m.rules) > 0 {
			t.Errorf("PrometheusRules %v rendered with prometheusRule.enabled false", slices.Collect(maps.Keys(m.rules)))
		}
		return
	}
	if len(m.rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(m.rules))
	}
	r := m.rules[fullname]
	if r == nil {
		t.Fatalf("no PrometheusRule %s", fullname)
	}
	if r.APIVersion != "monitoring.coreos.com/v1" || r.Kind != "PrometheusRule" {
		t.Errorf("rendered as %s %s", r.APIVersion, r.Kind)
	}
	for k, want := range v.PrometheusRule.Labels {
		if got := r.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q: the Prometheus's ruleSelector would miss it", k, got, want)
		}
	}
	matchers := v.PrometheusRule.Matchers
	if matchers == "" {
		matchers = `namespace="` + namespace + `"`
	}
	declared, err := metricnames.Declared("../..")
	if err != nil {
		t.Fatal(err)
	}

	// Recording rules first: an alert may read them.
	recorded := map[string]bool{}
	for _, g := range r.Spec.Groups {
		for _, rule := range g.Rules {
			if rule.Record == "" {
				continue
			}
			if !recordName.MatchString(rule.Record) || rule.Alert != "" || rule.For != "" || len(rule.Annotations) > 0 {
				t.Errorf("recording rule %q: want a name like stillthere:canary_on_time:ratio_rate5m, and no alert, for or annotations", rule.Record)
			}
			if recorded[rule.Record] {
				t.Errorf("recording rule %s twice", rule.Record)
			}
			recorded[rule.Record] = true
			checkExpr(t, rule.Record, rule.Expr, matchers, declared, nil)
		}
	}
	seen := map[string]bool{}
	for _, g := range r.Spec.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q is unnamed or empty", g.Name)
		}
		for _, rule := range g.Rules {
			if rule.Record != "" {
				continue
			}
			name := rule.Alert
			if !alertName.MatchString(name) {
				t.Errorf("alert %q: want a name like StillthereGuidesLate", name)
			}
			if seen[name] {
				t.Errorf("alert %s twice", name)
			}
			seen[name] = true
			checkExpr(t, name, rule.Expr, matchers, declared, recorded)
			if !promDuration.MatchString(rule.For) {
				t.Errorf("%s: for %q is not a Prometheus duration", name, rule.For)
			}
			if sev := rule.Labels["severity"]; !slices.Contains(severities, sev) {
				t.Errorf("%s: severity %q, want one of %q", name, sev, severities)
			}
			for k, want := range v.PrometheusRule.AlertLabels {
				if got := rule.Labels[k]; got != want {
					t.Errorf("%s: label %s = %q, want %q from prometheusRule.alertLabels", name, k, got, want)
				}
			}
			for _, a := range []string{"summary", "description"} {
				text := rule.Annotations[a]
				if strings.TrimSpace(text) == "" {
					t.Errorf("%s: no %s", name, a)
				}
				if strings.Count(text, "{{") != strings.Count(text, "}}") {
					t.Errorf("%s: %s has unbalanced template braces: %q", name, a, text)
				}
				// A label the expression aggregates away reads as empty.
				for _, ref := range labelRef.FindAllStringSubmatch(text, -1) {
					if !regexp.MustCompile(`\b` + ref[1] + `\b`).MatchString(rule.Expr) {
						t.Errorf("%s: %s names $labels.%s, which its expression does not keep", name, a, ref[1])
					}
				}
			}
			if req, ok := requiredAlerts[name]; ok {
				if names, _ := metricnames.Referenced(rule.Expr); !slices.Contains(names, req.series) {
					t.Errorf("%s does not query %s: %s", name, req.series, rule.Expr)
				}
				if sev := rule.Labels["severity"]; sev != req.severity {
					t.Errorf("%s: severity %q, want %q", name, sev, req.severity)
				}
			}
		}
	}
	for name := range requiredAlerts {
		if !seen[name] {
			t.Errorf("no alert %s", name)
		}
	}
	if fd := findRule(r, "StillthereGatewayFleetDown"); fd != "1m" {
		t.Errorf("StillthereGatewayFleetDown fires after %q, want 1m", fd)
	}
	if lag := findRule(r, "StillthereActivityFeedLag"); lag != "2m" {
		t.Errorf("StillthereActivityFeedLag fires after %q, want 2m", lag)
	}
}

// checkExpr: an alert's expression is balanced, and every series it names
// is published by a service and selected with the release's matchers, or
// is one of the recorded series (which were selected so).
func checkExpr(t *testing.T, alert, expr, matchers string, declared, recorded map[string]bool) {
	t.Helper()
	if strings.TrimSpace(expr) == "" {
		t.Errorf("%s: empty expression", alert)
		return
	}
	for _, p := range []string{"()", "{}", "[]"} {
		if strings.Count(expr, p[:1]) != strings.Count(expr, p[1:]) {
			t.Errorf("%s: unbalanced %s in %s", alert, p, expr)
		}
	}
	names, ends := metricnames.Referenced(expr)
	refs := recordRef.FindAllString(expr, -1)
	for _, r := range refs {
		if !recorded[r] {
			t.Errorf("%s: %s is no recording rule of the chart's", alert, r)
		}
	}
	if len(names) == 0 && len(refs) == 0 {
		t.Errorf("%s: queries no stillthere_ series: %s", alert, expr)
	}
	for i, n := range names {
		if !declared[n] {
			t.Errorf("%s: %s is not a series the services publish (pkg/*/metrics.go)", alert, n)
		}
		rest := expr[ends[i]:]
		end := strings.Index(rest, "}")
		if !strings.HasPrefix(rest, "{") || end < 0 || !strings.Contains(rest[:end], matchers) {
			t.Errorf("%s: %s is not scoped by %s: %s", alert, n, matchers, expr)
		}
	}
}

// findRule is the for of the named alert.
func findRule(r *prometheusRule, alert string) string {
	for _, g := range r.Spec.Groups {
		for _, rule := range g.Rules {
			if rule.Alert == alert {
				return rule.For
			}
		}
	}
	return ""
}
