package canary

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/stillthere/stillthere/pkg/promise"
)

// The canary's metrics: the promise as its synthetic users saw it. The
// chart's recording rules and burn-rate alerts read stagesTotal.
var (
	stagesTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_canary_stages_total",
		Help: "Stages of the canary's silences (and guides that belong to none) judged by the promise checker, by class (ok, late, lost, false, duplicated, disordered, indeterminate, spam), each counted once, when it is no longer pending; a stage counted as keeping the promise that a later guide breaks (a duplicate past its bound) is counted once more, in its failure class.",
	}, []string{"class"})
	lateness = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "stillthere_canary_stage_lateness_seconds",
		Help:    "How long past its due time each stage judged ok or late was first delivered.",
		Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300},
	})
	silencesTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_canary_silences_total",
		Help: "Silences the canary's users began on purpose, by how they signalled before (ping: WebSocket pings; activity: the activity API).",
	}, []string{"via"})
	signalsTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_canary_signals_total",
		Help: "Signals the canary's users sent, by way (ping, activity) and outcome (answered, refused, no_answer; rejected: a 4xx of the activity API, which is the canary's configuration at fault).",
	}, []string{"via", "outcome"})
	guidesTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_canary_guides_total",
		Help: "Guide frames the canary's users received, by the role of the user (stayer: any guide is false; leaver).",
	}, []string{"role"})
	dialsTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_canary_dials_total",
		Help: "WebSocket connects of the canary's users, by result (ok, failed).",
	}, []string{"result"})
	lastCheck = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_canary_last_check_timestamp_seconds",
		Help: "When the canary last ran the promise checker (Unix seconds): an alert on its age tells a canary that stopped judging.",
	})
	clockOffset = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_canary_redis_clock_ahead_seconds",
		Help: "How far Redis's clock is ahead of the canary's (negative: behind), at most, as the latest pong bounds it (a ping's way in counts as ahead); the canary judges deadlines in its own clock by it, never later than they were.",
	})
	ttlMismatches = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_canary_ttl_mismatches_total",
		Help: "Pongs that granted a TTL outside canary-ttl to canary-ttl plus canary-jitter: the canary segment's policy and the canary's settings differ, and its judgement of feed users and its cycles are off.",
	})
	historiesHeld = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_canary_histories",
		Help: "Users' histories the canary holds: cycles running, or ended and not judged yet.",
	})
)

// classes are every class a stage can be given, so that each series exists
// (at 0) from the start and rates over it are defined.
var classes = []promise.Class{promise.OK, promise.Late, promise.Lost, promise.False, promise.Duplicated,
	promise.Disordered, promise.Indeterminate, promise.Spam}

// initSeries creates those series; Open calls it.
func initSeries() {
	for _, c := range classes {
		stagesTotal.WithLabelValues(string(c))
	}
	for _, via := range []string{viaPing, viaActivity} {
		silencesTotal.WithLabelValues(via)
		for _, o := range []string{outcomeAnswered, outcomeRefused, outcomeNoAnswer} {
			signalsTotal.WithLabelValues(via, o)
		}
	}
	signalsTotal.WithLabelValues(viaActivity, outcomeRejected)
}

// count exports verdicts that became final.
func count(vs []promise.Verdict) {
	for _, v := range vs {
		stagesTotal.WithLabelValues(string(v.Class)).Inc()
		if v.Delivered && (v.Class == promise.OK || v.Class == promise.Late) {
			lateness.Observe(v.Lateness.Seconds())
		}
	}
}
