package guide

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
)

// slowChecks is a hook that makes each round trip of session checks take
// by longer, as a Redis under load does; other commands are left alone.
type slowChecks struct {
	by time.Duration
	ks session.Keyspace
}

func (s slowChecks) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s slowChecks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := s.wait(ctx, []redis.Cmder{cmd}); err != nil {
			return err
		}
		return next(ctx, cmd)
	}
}

func (s slowChecks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := s.wait(ctx, cmds); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}

func (s slowChecks) wait(ctx context.Context, cmds []redis.Cmder) error {
	skew := skewRedis{ks: s.ks}
	for _, c := range cmds {
		if skew.isCheck(c.Args()) {
			select {
			case <-time.After(s.by):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// TestSlowRedisChecksWithinSendTimeout: every round trip of session
// checks takes 60% of SendTimeout, within it, as each check alone did
// before checks were batched. A check asked for while a batch is out
// waits for that batch and then its own: it must not be cut off at
// SendTimeout from when it was asked for, counted against the Redis
// breaker, which then opens and pauses fetching although Redis answers
// every round trip in time.
func TestSlowRedisChecksWithinSendTimeout(t *testing.T) {
	e := newEnv(t)
	// A SendTimeout of a second leaves the round trip 400ms past its
	// delay: 80ms (of the test config's 200ms) was too little for a busy
	// host's, and the check was cut off as it should be.
	e.cfg.SendTimeout = time.Second
	errs0 := sendErrors(t)
	opens0 := metricValue(t, "stillthere_consumer_breaker_changes_total", "downstream", downstreamRedis, "to", "open")
	delay := e.cfg.SendTimeout * 6 / 10
	evs := e.produce(uids("slow-check", 24)...)
	e.start(e.cfg, func(c *Consumer) {
		// The script cached first: a check sent by its source after
		// NOSCRIPT would take a second slow round trip.
		if _, errs := c.checkSessions(context.Background(), []string{"warm"}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		c.rdb.AddHook(slowChecks{by: delay, ks: c.keyspace})
	})
	e.waitShown(evs)
	e.waitCommittedToEnd(e.cfg.Group)
	if d := sendErrors(t) - errs0; d != 0 {
		t.Errorf("%v records failed an attempt, want none: each round trip of checks took %v, within SendTimeout %v", d, delay, e.cfg.SendTimeout)
	}
	if d := metricValue(t, "stillthere_consumer_breaker_changes_total", "downstream", downstreamRedis, "to", "open") - opens0; d != 0 {
		t.Errorf("the Redis breaker opened %v times, want never", d)
	}
}
