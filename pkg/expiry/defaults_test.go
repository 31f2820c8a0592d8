package expiry

import (
	"testing"

	"github.com/stillthere/stillthere/pkg/config/configtest"
)

// TestDefaultConfig: DefaultConfig is what the flags give when none is
// set, and it is valid as it is: the listener has no secret.
func TestDefaultConfig(t *testing.T) {
	configtest.CheckDefaults(t, DefaultConfig(), nil)
}
