package guide

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestOutcomesNameTheMetric: the guides metric's help names every
// outcome, each once, as the label values it counts.
func TestOutcomesNameTheMetric(t *testing.T) {
	const want = "Timeout events settled, by outcome (delivered, duplicate, queued, stale, too_old, rejected, invalid)."
	desc := make(chan *prometheus.Desc, 1)
	metricGuides.Describe(desc)
	if d := (<-desc).String(); !strings.Contains(d, `help: "`+want+`"`) {
		t.Errorf("metric %s, want help %q", d, want)
	}
	seen := map[Outcome]bool{}
	for _, o := range outcomes {
		if seen[o] {
			t.Errorf("outcome %q listed twice", o)
		}
		seen[o] = true
	}
}
