package gateway

import (
	"flag"
	"reflect"
	"testing"

	"github.com/stillthere/stillthere/pkg/config"
)

// TestDefaultConfig: DefaultConfig is what the flags give when none is
// set, and it is valid once the secrets, which have no default, are.
func TestDefaultConfig(t *testing.T) {
	var c Config
	b := config.NewBinder(flag.NewFlagSet("defaults", flag.ContinueOnError), nil)
	c.Bind(b)
	if err := b.Parse(nil); err != nil {
		t.Fatal(err)
	}
	d := DefaultConfig()
	if !reflect.DeepEqual(c, d) {
		t.Errorf("flag defaults:\n%+v\nDefaultConfig:\n%+v", c, d)
	}
	d.TokenSecret, d.PushSecret = tokenSecret, pushSecret
	if err := d.Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
}
