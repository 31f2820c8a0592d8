package guide

import (
	"testing"

	"github.com/stillthere/stillthere/pkg/config/configtest"
)

// TestDefaultConfig: DefaultConfig is what the flags give when none is
// set, and it is valid once the secret, which has no default, is.
func TestDefaultConfig(t *testing.T) {
	configtest.CheckDefaults(t, DefaultConfig(), func(c *Config) { c.PushSecret = testSecret })
}
