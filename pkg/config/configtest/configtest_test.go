package configtest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
)

// cfg is a service config of one setting and one secret.
type cfg struct {
	Every  time.Duration
	Secret string
}

func (c *cfg) Bind(b *config.Binder) {
	b.Duration(&c.Every, "every", time.Second, "how often")
	b.Secret(&c.Secret, "secret", "the secret (required)")
}

func (c cfg) Validate() error {
	if c.Secret == "" {
		return errors.New("secret: empty")
	}
	return nil
}

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatal(args ...any) { r.errs = append(r.errs, fmt.Sprint(args...)) }

func TestCheckDefaults(t *testing.T) {
	withSecret := func(c *cfg) { c.Secret = "s" }
	for _, tc := range []struct {
		name    string
		def     cfg
		secrets func(*cfg)
		fails   int
	}{
		{"the flags' defaults, with the secret", cfg{Every: time.Second}, withSecret, 0},
		{"a default the flags do not give", cfg{Every: time.Minute}, withSecret, 1},
		{"no secret set", cfg{Every: time.Second}, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			CheckDefaults(r, tc.def, tc.secrets)
			if len(r.errs) != tc.fails {
				t.Errorf("failures %q, want %d", r.errs, tc.fails)
			}
		})
	}
}
