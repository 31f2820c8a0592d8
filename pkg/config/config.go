// Package config binds service settings to command-line flags with an
// environment fallback, which is how Helm and the dev stack configure the
// services. Every flag "foo-bar" falls back to STILLTHERE_FOO_BAR; a flag
// given on the command line wins over the environment.
package config

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// EnvPrefix starts the name of every environment variable the services read.
const EnvPrefix = "STILLTHERE_"

// Lookup finds an environment variable, like os.LookupEnv. Tests and the
// dev stack pass their own to run services with other settings.
type Lookup func(key string) (string, bool)

// EnvName is the environment variable that backs the flag name.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Binder registers flags whose defaults come from the environment. A value
// in the environment that does not parse is remembered and reported by Err,
// naming the variable, so a typo in a Helm value fails the start loudly.
type Binder struct {
	fs   *flag.FlagSet
	env  Lookup
	errs []error
}

// NewBinder binds flags on fs with defaults from env. A nil env reads nothing.
func NewBinder(fs *flag.FlagSet, env Lookup) *Binder {
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	return &Binder{fs: fs, env: env}
}

// Err reports every environment value that did not parse.
func (b *Binder) Err() error { return errors.Join(b.errs...) }

func (b *Binder) lookup(name string) (string, string, bool) {
	key := EnvName(name)
	v, ok := b.env(key)
	return key, v, ok && v != ""
}

func (b *Binder) usage(name, usage string) string {
	return fmt.Sprintf("%s (env %s)", usage, EnvName(name))
}

// String binds a string setting.
func (b *Binder) String(p *string, name, def, usage string) {
	if _, v, ok := b.lookup(name); ok {
		def = v
	}
	b.fs.StringVar(p, name, def, b.usage(name, usage))
}

// Secret binds a string that must not show in -h output: its value from
// the environment is not printed as the flag's default.
func (b *Binder) Secret(p *string, name, usage string) {
	_, v, _ := b.lookup(name)
	*p = v
	b.fs.Func(name, b.usage(name, usage), func(s string) error {
		*p = s
		return nil
	})
}

// List binds a comma-separated list. Blank items are dropped.
func (b *Binder) List(p *[]string, name, def, usage string) {
	if _, v, ok := b.lookup(name); ok {
		def = v
	}
	*p = SplitList(def)
	if def != "" {
		usage += fmt.Sprintf(" (default %q)", def)
	}
	b.fs.Func(name, b.usage(name, usage), func(s string) error {
		*p = SplitList(s)
		return nil
	})
}

// Duration binds a duration such as "60s" or "250ms".
func (b *Binder) Duration(p *time.Duration, name string, def time.Duration, usage string) {
	if key, v, ok := b.lookup(name); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s=%q: not a duration such as 60s or 250ms", key, v))
		} else {
			def = d
		}
	}
	b.fs.DurationVar(p, name, def, b.usage(name, usage))
}

// Int binds an integer.
func (b *Binder) Int(p *int, name string, def int, usage string) {
	if key, v, ok := b.lookup(name); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s=%q: not an integer", key, v))
		} else {
			def = n
		}
	}
	b.fs.IntVar(p, name, def, b.usage(name, usage))
}

// Float binds a floating-point number.
func (b *Binder) Float(p *float64, name string, def float64, usage string) {
	if key, v, ok := b.lookup(name); ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s=%q: not a number", key, v))
		} else {
			def = f
		}
	}
	b.fs.Float64Var(p, name, def, b.usage(name, usage))
}

// SplitList splits a comma-separated list, trimming blanks.
func SplitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// Parse parses args after all settings are bound, and reports flag errors
// and environment errors together.
func (b *Binder) Parse(args []string) error {
	if err := b.fs.Parse(args); err != nil {
		return err
	}
	return b.Err()
}

// Bool binds a boolean such as "true" or "false".
func (b *Binder) Bool(p *bool, name string, def bool, usage string) {
	if key, v, ok := b.lookup(name); ok {
		t, err := strconv.ParseBool(v)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s=%q: not true or false", key, v))
		} else {
			def = t
		}
	}
	b.fs.BoolVar(p, name, def, b.usage(name, usage))
}
