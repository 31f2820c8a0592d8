package guide

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/sony/gobreaker/v2"

	"github.com/stillthere/stillthere/pkg/push"
)

// Downstream names, the label of the breaker metrics, besides the
// sender's own (SenderGateway, SenderWebhook).
const (
	downstreamRedis  = "redis"
	downstreamNotify = "notify" // the platform's notify webhook
)

// newBreaker returns the circuit breaker around one downstream. It opens
// after cfg.BreakerFailures failures in a row (timeouts are failures) and
// lets one probe through after cfg.BreakerTimeout. Our own cancellation
// says nothing about the downstream and is not counted; a permanentError
// is the downstream answering, so it counts as a success.
func newBreaker[T any](name string, cfg Config, log *slog.Logger) *gobreaker.CircuitBreaker[T] {
	metricBreakerState.WithLabelValues(name).Set(float64(gobreaker.StateClosed))
	return gobreaker.NewCircuitBreaker[T](gobreaker.Settings{
		Name:        name,
		MaxRequests: 1,
		Timeout:     cfg.BreakerTimeout,
		ReadyToTrip: func(n gobreaker.Counts) bool {
			return n.ConsecutiveFailures >= uint32(cfg.BreakerFailures)
		},
		IsSuccessful: func(err error) bool { return err == nil || isPermanent(err) },
		IsExcluded:   func(err error) bool { return errors.Is(err, context.Canceled) || isUserBusy(err) },
		OnStateChange: func(name string, from, to gobreaker.State) {
			metricBreakerState.WithLabelValues(name).Set(float64(to))
			metricBreakerChanges.WithLabelValues(name, to.String()).Inc()
			// A probe that fails moves open to half-open to open once
			// per timeout for as long as the outage lasts: only its start
			// and end are worth a line.
			level := slog.LevelDebug
			switch {
			case from == gobreaker.StateClosed:
				level = slog.LevelWarn
			case to == gobreaker.StateClosed:
				level = slog.LevelInfo
			}
			log.Log(context.Background(), level, "circuit breaker state changed",
				"downstream", name, "from", from.String(), "to", to.String())
		},
	})
}

// isBreakerRefusal reports whether err is a breaker refusing the call
// rather than the downstream failing it.
func isBreakerRefusal(err error) bool {
	return errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests)
}

// pausingStates is the state of the breakers whose opening pauses
// fetching: the sender's and Redis's, which every guide needs. Not the
// notify webhook's, which only notify stages need: a notify stage that
// finds it open is retried on its own, after its backoff (the breaker
// lets one through as a probe after BreakerTimeout), its user's later
// stages wait behind it (one key's records go in order), and other users'
// guides flow on, until the records held reach MaxInFlight.
func (c *Consumer) pausingStates() []gobreaker.State {
	return []gobreaker.State{c.breaker.State(), c.redisBreaker.State()}
}

// isUserBusy reports whether err is the gateway's 409: this user's guide
// cannot be settled now (another push of it is under way, or an instance
// holding the user missed its heartbeat), which says nothing of the
// gateway, and is retried without counting against the breaker.
func isUserBusy(err error) bool {
	var pe *push.Error
	return errors.As(err, &pe) && pe.Status == push.Retry && pe.Code == http.StatusConflict
}
