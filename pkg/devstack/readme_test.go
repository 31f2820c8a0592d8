package devstack

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/expiry"
	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/guide"
)

// TestREADMEDocumentsEverySetting keeps the configuration table honest:
// every setting a service reads must appear in README.md.
func TestREADMEDocumentsEverySetting(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var g gateway.Config
	var l expiry.Config
	var c guide.Config
	// The services share some settings; bind each on its own set.
	for _, bind := range []func(*config.Binder){g.Bind, l.Bind, c.Bind} {
		fs := flag.NewFlagSet("svc", flag.ContinueOnError)
		bind(config.NewBinder(fs, nil))
		fs.VisitAll(func(f *flag.Flag) {
			name := config.EnvName(f.Name)
			if !strings.Contains(string(readme), "`"+name+"`") {
				t.Errorf("README.md does not document %s", name)
			}
		})
	}
}
