// Package configtest checks a service's configuration the way each of the
// three services' tests checks its own.
package configtest

import (
	"flag"
	"reflect"
	"testing"

	"github.com/stillthere/stillthere/pkg/config"
)

// Binding is a service's Config, as a pointer: it binds its settings to
// flags and validates itself.
type Binding[C any] interface {
	*C
	Bind(*config.Binder)
	Validate() error
}

// CheckDefaults fails t unless def (the service's DefaultConfig) is what
// the flags give when none is set, and is valid once secrets has set the
// secrets, which have no default (nil when the service needs none).
func CheckDefaults[C any, P Binding[C]](t testing.TB, def C, secrets func(*C)) {
	t.Helper()
	var c C
	b := config.NewBinder(flag.NewFlagSet("defaults", flag.ContinueOnError), nil)
	P(&c).Bind(b)
	if err := b.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, def) {
		t.Errorf("flag defaults:\n%+v\nDefaultConfig:\n%+v", c, def)
	}
	if secrets != nil {
		secrets(&def)
	}
	if err := P(&def).Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
}
