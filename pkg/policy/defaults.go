package policy

import "time"

// Defaults of the settings that gateways, expiry listeners and the policy
// command read alike, so that every one of them holds the same policy
// until one is stored.
const (
	// DefaultSessionTTL and DefaultSessionJitter are session-ttl and
	// session-jitter: the TTL every ping grants, and the uniform extra in
	// [0, jitter) that keeps expiries from clumping.
	DefaultSessionTTL    = 60 * time.Second
	DefaultSessionJitter = 5 * time.Second
	// DefaultRefresh is policy-refresh: how often a stored policy is
	// re-read.
	DefaultRefresh = 2 * time.Second
	// DefaultRenewGranularity is renew-granularity: the least time
	// between two renewals of one user's session on one gateway. No TTL
	// may be shorter than twice it.
	DefaultRenewGranularity = time.Second
)

// DefaultClosing is close-after and close-text by default.
func DefaultClosing() Closing { return Closing{After: DefaultCloseAfter, Text: DefaultCloseText} }
