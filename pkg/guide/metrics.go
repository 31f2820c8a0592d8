package guide

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

var (
	metricGuides = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_consumer_guides_total",
		Help: "Timeout events settled, by outcome (" + outcomeList() + ").",
	}, []string{"outcome"})
	metricSendErrors = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_consumer_send_errors_total",
		Help: "Attempts that failed and will be retried (a breaker refusing included).",
	})
	metricBreakerState = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "stillthere_consumer_breaker_state",
		Help: "Circuit breaker state per downstream: 0 closed, 1 half-open, 2 open.",
	}, []string{"downstream"})
	metricBreakerChanges = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_consumer_breaker_changes_total",
		Help: "Circuit breaker state changes per downstream, by the state entered.",
	}, []string{"downstream", "to"})
	metricPaused = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_consumer_paused_partitions",
		Help: "Partitions whose fetching is paused (breaker open, or in-flight bound reached).",
	})
	metricInFlight = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_consumer_in_flight",
		Help: "Records taken from Kafka and not yet settled: being sent or waiting to be retried.",
	})
	metricLag = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "stillthere_consumer_lag",
		Help: "Records past the group's commit, per partition this replica owns.",
	}, []string{"partition"})
	metricSendSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "stillthere_consumer_send_seconds",
		Help:    "Latency of one send to the downstream.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	metricCheckBatch = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "stillthere_consumer_session_check_batch",
		Help:    "Session checks sent to Redis together in one pipelined round trip.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 10),
	})
	metricEndToEnd = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name: "stillthere_consumer_deadline_to_delivery_seconds",
		Help: "Time from when a guide was due to its delivery, by stage (1-10): stage 1 is due at the session's deadline, " +
			"each later stage its delay after the one before, so this is each stage's lateness.",
		Buckets: []float64{.05, .1, .2, .3, .5, .75, 1, 1.5, 2, 5, 10, 30, 60, 300},
	}, []string{"stage"})
	metricStageGuides = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_consumer_stage_guides_total",
		Help: "Guides sent (delivered, or queued for the user's next connect), by stage of the silence (1-10) " +
			"and action (remind, close, notify): action=\"close\" counts the chats closed for inactivity, " +
			"action=\"notify\" the notify stages the platform's notify webhook took.",
	}, []string{"stage", "action"})
)

// observeSent books a guide the downstream took (outcome), by its stage.
// Parse bounds the stage to 1-timeoutevent.MaxStages and the action to
// two values, so the labels' cardinality is bounded.
func observeSent(ev timeoutevent.Event, outcome Outcome) {
	if !outcome.sent() {
		return
	}
	stage := strconv.Itoa(min(max(ev.Stage, 1), timeoutevent.MaxStages))
	metricStageGuides.WithLabelValues(stage, ev.Action).Inc()
	if outcome == OutcomeDelivered {
		// A metric, not a decision, so the local clock will do: it is
		// off by as much as this host's clock is from Redis's.
		metricEndToEnd.WithLabelValues(stage).Observe(time.Since(time.UnixMilli(ev.DueMS)).Seconds())
	}
}
