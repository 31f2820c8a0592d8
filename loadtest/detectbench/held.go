package main

import (
	"github.com/prometheus/client_golang/prometheus"
)

// heldMetric counts timeouts the listeners of this process held for the
// outage grace, by rule.
const heldMetric = "stillthere_listener_held_total"

// held reads the listeners' held timeouts so far, by rule. The listeners
// run in this process, so their counters are in its default registry.
func held() map[string]int {
	out := map[string]int{}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != heldMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			rule := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" {
					rule = l.GetValue()
				}
			}
			out[rule] += int(m.GetCounter().GetValue())
		}
	}
	return out
}

// heldTotal is held summed over the rules.
func heldTotal() int {
	n := 0
	for _, v := range held() {
		n += v
	}
	return n
}
