package gateway

import (
	"testing"

	"github.com/stillthere/stillthere/pkg/config/configtest"
)

// TestDefaultConfig: DefaultConfig is what the flags give when none is
// set, and it is valid once the secrets, which have no default, are.
func TestDefaultConfig(t *testing.T) {
	configtest.CheckDefaults(t, DefaultConfig(), func(c *Config) {
		c.TokenSecret, c.PushSecret = tokenSecret, pushSecret
	})
}
