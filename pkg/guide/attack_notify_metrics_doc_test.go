package guide

import (
	"os"
	"strings"
	"testing"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackNotifyMetricsUndocumented: the consumer's metrics carry
// label values for notify stages that README.md's metrics table, which an
// operator writes alerts and dashboards from, does not list. The notify
// webhook's breaker is stillthere_consumer_breaker_state{downstream=
// "notify"} (docs/protocol.md, "Notify webhook", points operators to it),
// yet the table says downstream is "redis, gateway or webhook"; and each
// notify sent counts in stillthere_consumer_stage_guides_total with
// action="notify", while the table and the metric's own help say the
// action is remind or close and that these count guides sent to users.
func TestAttackNotifyMetricsUndocumented(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := func(metric string) string {
		for _, line := range strings.Split(string(readme), "\n") {
			if strings.HasPrefix(line, "| `"+metric) {
				return line
			}
		}
		t.Fatalf("README.md has no metrics row for %s", metric)
		return ""
	}
	if r := row("stillthere_consumer_breaker_state"); !strings.Contains(r, "`"+downstreamNotify+"`") {
		t.Errorf("README.md's breaker_state row does not list downstream %q, the notify webhook's breaker:\n%s", downstreamNotify, r)
	}
	if r := row("stillthere_consumer_stage_guides_total"); !strings.Contains(r, "`"+timeoutevent.ActionNotify+"`") {
		t.Errorf("README.md's stage_guides_total row does not list action %q, which every notify sent counts under:\n%s", timeoutevent.ActionNotify, r)
	}
}
