package expiry

import (
	"context"

	"github.com/stillthere/stillthere/pkg/kafka"
)

// The topic is created at start if it is missing, or else by the
// replayer, which keeps trying; until it is known to exist, events go to
// the spool, so that a broker that creates topics on first use never
// creates this one with its own defaults.

// ensureTopic creates the topic unless it exists, and records the outcome.
func (l *Listener) ensureTopic(ctx context.Context) bool {
	err := kafka.EnsureTopic(ctx, l.producer, l.cfg.Kafka)
	if err != nil {
		l.kafkaErr.Store(&err)
		l.topicDown.Fail(err)
		return false
	}
	l.topicDown.OK()
	l.kafkaErr.Store(nil)
	l.topicReady.Store(true)
	return true
}
