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
		Help: "Upgrade requests refused before the upgrade, by reason (token, origin).",
	}, []string{"reason"})
	metricFrames = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_frames_total",
		Help: "Client frames received, by type (ping, ack, unknown, invalid, binary).",
	}, []string{"type"})
	metricRenewals = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_renewals_total",
		Help: "Session renewals, by result (ok, error).",
	}, []string{"result"})
	metricRenewalSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "stillthere_gateway_renewal_seconds",
		Help:    "Latency of a session renewal in Redis.",
		Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
	})
	metricPushes = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_pushes_total",
		Help: "Guide pushes, by outcome (delivered, duplicate, offline, rejected).",
	}, []string{"outcome"})
	metricCloses = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_gateway_closes_total",
		Help: "Connections ended, by close code the gateway sent or received (1000, 1001, 1003, 1007, 1008, 1009, or abnormal).",
	}, []string{"code"})
	metricSlowClients = promauto.NewCounter(prometheus.CounterOpts{
		Name: "stillthere_gateway_slow_clients_total",
		Help: "Connections cut off because their send queue was full.",
	})
)
