package activityfeed

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	metricRecords = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_activity_feed_records_total",
		Help: "Records of the activity topic this member handled, by outcome: applied, dead-lettered (refused, with the reason in a header).",
	}, []string{"outcome"})
	metricLag = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_activity_feed_lag_seconds",
		Help: "How far the activity watermark of the partitions this member owns trails Redis's clock, at its last stamp: the listener holds deadlines past it. Take the max over members.",
	})
)
