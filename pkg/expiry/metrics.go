package expiry

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	metricSeen = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_listener_expired_seen_total",
		Help: "Expired sessions found, by path (sweep, event).",
	}, []string{"path"})
	metricDedupHits = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_listener_dedup_hits_total",
		Help: "Expired sessions skipped because their timeout was already produced in this minute window.",
	})
	metricProduced = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_listener_produced_total",
		Help: "Timeout events produced, by path.",
	}, []string{"path"})
	metricProduceErrors = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_listener_produce_errors_total",
		Help: "Timeout events that failed to produce; they are retried by the next sweep.",
	})
	metricLag = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "stillthere_listener_detection_lag_seconds",
		Help:    "Time from a session's deadline (for a later stage, from when it was due) to its timeout event being produced, by path (sweep, event, spool).",
		Buckets: []float64{.01, .025, .05, .1, .2, .3, .5, .75, 1, 2, 5, 10, 30, 60, 120},
	}, []string{"path"})
	metricStagesDropped = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_listener_stages_dropped_total",
		Help: "Silences ended at a stage their segment's timeout policy no longer has (the policy changed between stages); no event was produced.",
	})
	metricSweepSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "stillthere_listener_sweep_seconds",
		Help:    "Duration of one sweep of the deadline index over all buckets (with the read-ahead on, the safety sweep).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18), // to 65s: a storm's, or a starved host's
	})
	metricFireSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "stillthere_listener_fire_seconds",
		Help:    "Duration of one fire slot of the read-ahead that found timeouts due: confirming its timers in Redis and emitting what they found.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
	})
	metricDue = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_listener_due_backlog",
		Help: "Expired sessions found by the last sweep.",
	})
	metricOwnedBuckets = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_listener_owned_buckets",
		Help: "Deadline-index buckets this replica reads ahead and times locally (of 64, shared among the replicas that take work); 0 with the read-ahead off.",
	})
	metricTimers = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_listener_timers",
		Help: "Local timers armed for deadlines and hold releases read ahead.",
	})
	metricConfirms = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_listener_confirms_total",
		Help: "Fired local timers whose timeout was asked of Redis (confirmed due or not).",
	})
	metricNotDue = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_listener_confirm_not_due_total",
		Help: "Fired local timers Redis did not find due: renewed since the read-ahead, settled by another replica, or fired before Redis's clock got there.",
	})
	metricSubscribeErrors = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_listener_subscribe_errors_total",
		Help: "Broken keyspace-event subscriptions (events are lost until resubscribed; the sweep covers them).",
	})
	metricSubscriptions = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_listener_subscriptions",
		Help: "Redis masters whose expired keyspace events the listener is subscribed to.",
	})
	metricSpooled = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_listener_spooled_total",
		Help: "Timeout events written to the spool because Kafka did not take them, or others waited there first.",
	})
	metricReplayed = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_listener_replayed_total",
		Help: "Spooled timeout events produced to Kafka.",
	})
	metricSpoolEvents = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_listener_spool_events",
		Help: "Timeout events waiting in the spool.",
	})
	metricSpoolBytes = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_listener_spool_bytes",
		Help: "Size of the spool file.",
	})
	metricSpoolFull = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_listener_spool_full",
		Help: "1 while the spool is at its cap and sweeps pause, else 0.",
	})
	metricSpoolCorrupt = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_listener_spool_unreadable_total",
		Help: "Spooled events that no longer parsed and were dropped (a damaged disk).",
	})
	metricSpoolDamaged = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_listener_spool_damaged_bytes_total",
		Help: "Bytes of the spool file whose frames failed their checksum, which the replay went past to the next intact event (a damaged disk); kept in spool.log.damaged.",
	})
	metricHeld = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_listener_held_total",
		Help: "Timeouts held out of the deadline index, then checked again before they are produced, by rule: " + holdRulesHelp() + ".",
	}, []string{"rule"})
	metricBlind = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_listener_blind_intervals_total",
		Help: "Blind intervals this listener found when marking a sweep, by reason (sweep-gap, data-lost, clock-jump, read-stall, redis-restart, failover).",
	}, []string{"reason"})
	metricBrake = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_listener_mass_expiry_brake",
		Help: "1 while the mass-expiry brake holds lapsing sessions for the grace, else 0.",
	})
	metricFleetDown = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_listener_gateway_fleet_down",
		Help: "1 while gateway instances are known and none has a live heartbeat, else 0.",
	})
	metricActivityWatermarkLag = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_listener_activity_watermark_lag_seconds",
		Help: "How far the activity feed's watermark trails Redis's clock, as the listener last read it; 0 without a feed. The listener judges no deadline past the watermark: a feed turned off without `gateway activity-feed forget` holds every guide.",
	})
)
