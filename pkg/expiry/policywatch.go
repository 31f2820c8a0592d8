package expiry

import (
	"cmp"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/policy"
)

// NewPolicyWatcher watches the stored timeout policy for the stages the
// listener schedules: the configured ones (see Config.FallbackPolicy)
// while none is stored, re-read every PolicyRefresh once the watcher
// runs. It checks no renewal granularity: that bound is on the TTLs the
// gateways grant, and a policy whose TTLs they refuse still has valid
// stages. The caller runs it (Refresh once, then Run) and stops it.
func (c Config) NewPolicyWatcher(rdb redis.UniversalClient, logger *slog.Logger) *policy.Watcher {
	return policy.NewWatcher(policy.NewStore(rdb, c.Redis.Keyspace()), c.FallbackPolicy(),
		cmp.Or(c.PolicyRefresh, policy.DefaultRefresh), 0, logger)
}
