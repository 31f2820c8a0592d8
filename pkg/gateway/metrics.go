package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	metricConnections = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_gateway_connections",
		Help: "Open WebSocket connections.",
	})
	metricRejected = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_rejected_total",
		Help: "Upgrade requests refused before the upgrade, by reason: token (401), origin (403), full (503, the instance at max-conns), user_full (429, the user at max-user-conns), draining (503, the instance shutting down).",
	}, []string{"reason"})
	metricTokens = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_tokens_total",
		Help: "Connection tokens, by event: refreshed or refused (auth frames), expired (connection closed with 4001).",
	}, []string{"event"})
	metricFrames = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_frames_total",
		Help: "Client frames received, by type (ping, ack, auth, unknown, invalid, binary).",
	}, []string{"type"})
	metricRenewals = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_renewals_total",
		Help: "Session renewals, by result (ok, error).",
	}, []string{"result"})
	metricRenewalSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "stillthere_gateway_renewal_seconds",
		Help:    "Time from a ping to its renewal being written, batching included.",
		Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
	})
	metricRenewalsCoalesced = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_renewals_coalesced_total",
		Help: "Pings answered from the last renewal of the user's connections on this instance in their segment, within the renewal granularity, without a Redis write of their own.",
	})
	metricRenewRoundTrips = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_renewal_round_trips_total",
		Help: "Redis round trips carrying renewals; renewals_total / this = renewals per round trip.",
	})
	metricRenewBatchSize = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "stillthere_gateway_renewal_batch_size",
		Help:    "Renewals per Redis round trip.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 10),
	})
	metricRenewFlushSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "stillthere_gateway_renewal_flush_seconds",
		Help:    "Latency of one pipelined renewal round trip.",
		Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
	})
	metricHeartbeats = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_heartbeats_total",
		Help: "Heartbeats of this instance to Redis, by result (ok, error).",
	}, []string{"result"})
	metricResynced = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_resynced_total",
		Help: "Last grants of connections handed to Redis by resyncs after it was out of reach; a deadline already as late stays.",
	})
	metricProofTimeouts = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_guide_proof_timeouts_total",
		Help: "Connections cut off because a guide written to them was not proven received (an ack, or a pong to the ping after it) within the write timeout: half-open connections, whose guides go to the user's next connection.",
	})
	metricDroppedGrants = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_gateway_dropped_grants",
		Help: "Grants of connections that dropped, kept until they run out for a resync after Redis loses its data.",
	})
	metricDroppedEvicted = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_dropped_grants_evicted_total",
		Help: "Grants of dropped connections forgotten before they ran out, because max-conns of them were held.",
	})
	metricPushes = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_pushes_total",
		Help: "Guide pushes, by outcome: delivered, queued, duplicate, stale, too_old, retry (409, 503), invalid (400), rejected (401); routed_in (from another instance); from_inbox (proven received on connect), inbox_stale and inbox_expired (dropped at hand-over); " +
			"inbox_superseded and superseded (dropped from the inbox, or pushed live, because the client's first ping said the user was there after the deadline); " +
			"handed_on (a guide its connection ended without proving, routed again), handed_on_stale (not, as its user renewed since its deadline); " +
			"came_back (a guide late on its way, judged again before a connection took it: its user renewed after its deadline meanwhile).",
	}, []string{"outcome"})
	metricRoutesPruned = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_routes_pruned_total",
		Help: "Route entries of instances dead by their heartbeat, dropped when a guide published to them reached nobody.",
	})
	metricRestartsSeen = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_redis_restarts_total",
		Help: "Times a Redis master's run id changed (a restart, perhaps without its data): every user is registered again and every session resynced.",
	})
	metricRouteRewrites = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_route_rewrites_total",
		Help: "Users whose route was written again because a ping's renewal found it not naming this instance: a Redis node lost it with its data, or another instance dropped this one's entry.",
	})
	metricCloses = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_closes_total",
		Help: "Connections ended, by close code the gateway sent or received (1000, 1001, 1003, 1007, 1008, 1009, 1013, 4000, 4001, or abnormal).",
	}, []string{"code"})
	metricClosedInactive = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_closed_inactive_total",
		Help: "Users closed for inactivity: sessions ended by the 4000 close that follows a close stage's guide " +
			"on the user's connections, counted when the session ends. One per user, however many devices; " +
			"a close stage for a user with no connection is queued, not counted, nor is one dropped as superseded.",
	})
	metricRateLimited = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_rate_limited_total",
		Help: "Connections closed with 1008 for going over the frame rate limit.",
	})
	metricSlowClients = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_slow_clients_total",
		Help: "Connections cut off because their send queue was full.",
	})
	metricChannelSubscribed = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "stillthere_gateway_channel_subscribed",
		Help: "1 while the instance channel, on which other instances route guides here, is subscribed; 0 while it is being subscribed again (readyz fails meanwhile).",
	})
	metricChannelLost = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_channel_lost_total",
		Help: "Subscriptions to the instance channel lost and subscribed again, by reason: unsubscribed (Redis took it, as when its cluster slot changes owner), " +
			"broken (the connection failed), no_subscriber (a probe found none where publishers look), probe_lost (a probe was counted but never read).",
	}, []string{"reason"})
	metricShed = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_shed_total",
		Help: "Connections closed with 1013 because Redis was out of the instance's reach for shed-after, so that clients reconnect elsewhere.",
	})
	metricActivityEvents = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_activity_events_total",
		Help: "Platform activity events (POST /v1/activity), by kind (active, turn_user, turn_us, end) and outcome: applied, stale (older than the state it would change), " +
			"failed (Redis out of reach: answered 503, nothing applied). The store counts applied and stale per batch, so a batch of several kinds counts as kind mixed. " +
			"A batch refused whole (400, or 413 past the body cap) counts once, as outcome refused of kind unknown: its events were not all read.",
	}, []string{"kind", "outcome"})
)
