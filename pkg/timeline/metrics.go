package timeline

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	metricEntries = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_timeline_entries_total",
		Help: "Decisions recorded in users' timelines, by service, kind and rule.",
	}, []string{"service", "kind", "rule"})
	metricDropped = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_timeline_dropped_total",
		Help: "Timeline entries not recorded: the queue was full, or Redis refused them. The decisions themselves were made.",
	}, []string{"service"})
)
