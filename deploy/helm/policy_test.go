package helm

import (
	"slices"
	"strings"
	"testing"
)

// TestChartPolicy: policy.closeAfter and policy.closeText reach the
// gateways and the listeners alike, as the same values, or neither (the
// services' defaults, the same in both); the chart refuses them out of
// range, and anywhere else, where the two could differ.
func TestChartPolicy(t *testing.T) {
	base := slices.Clone(secretValues)
	for _, tc := range []struct {
		name      string
		args      []string
		after     string // "" means not set
		text      string
		wantUnset bool
	}{
		{"the services' defaults", nil, "", "", true},
		{"set", []string{"--set", "policy.closeAfter=90s", "--set-string", "policy.closeText=Closed: bye."}, "90s", "Closed: bye.", false},
		{"no close stage, a number", []string{"--set", "policy.closeAfter=0"}, "0", "", false},
		{"no close stage, a string", []string{"--set-string", "policy.closeAfter=0"}, "0", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := render(t, append(slices.Clone(base), tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			m, err := decode(out)
			if err != nil {
				t.Fatalf("decoding the rendered chart strictly:\n%v", err)
			}
			for _, c := range []string{"gateway", "expiry-listener"} {
				d := m.deployments[fullname+"-"+c]
				if d == nil {
					t.Fatalf("no Deployment %s-%s", fullname, c)
				}
				envs := env(t, m, &d.Spec.Template.Spec.Containers[0])
				for name, want := range map[string]string{"STILLTHERE_CLOSE_AFTER": tc.after, "STILLTHERE_CLOSE_TEXT": tc.text} {
					got, ok := envs[name]
					if want == "" && ok {
						t.Errorf("%s: %s = %q, want it unset (the service's default)", c, name, got)
					}
					if want != "" && got != want {
						t.Errorf("%s: %s = %q, want %q from the values", c, name, got, want)
					}
				}
			}
		})
	}

	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"close too soon", []string{"--set", "policy.closeAfter=500ms"}, []string{"policy.closeAfter: 500ms, want 0 (no close stage) or between 1s and 24h"}},
		{"close too late", []string{"--set", "policy.closeAfter=25h"}, []string{"policy.closeAfter: 25h"}},
		{"close not a duration", []string{"--set-string", "policy.closeAfter=3"}, []string{"/policy/closeAfter"}},
		{"text too long in bytes", []string{"--set-string", "policy.closeText=" + strings.Repeat("é", 600)}, []string{"policy.closeText: 1200 bytes, want at most 1024"}},
		{"close through the gateway's map", []string{"--set", "gateway.config.close-after=1m"}, []string{"gateway.config.close-after", "STILLTHERE_CLOSE_AFTER"}},
		{"text through the listener's map", []string{"--set", "listener.config.STILLTHERE_CLOSE_TEXT=x"}, []string{"listener.config.STILLTHERE_CLOSE_TEXT", "STILLTHERE_CLOSE_TEXT"}},
		{"close through the common map", []string{"--set", "config.close-after=1m"}, []string{"config.close-after", "STILLTHERE_CLOSE_AFTER"}},
		{"close through extraEnv", []string{"--set", "listener.extraEnv[0].name=STILLTHERE_CLOSE_AFTER", "--set", "listener.extraEnv[0].value=1m"}, []string{"listener.extraEnv", "STILLTHERE_CLOSE_AFTER"}},
		{"misspelt key", []string{"--set", "policy.closeAfterSeconds=60"}, []string{"/policy", "closeAfterSeconds"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, append(slices.Clone(base), tc.args...)...)
			if err == nil {
				t.Fatalf("helm template %q succeeded, want an error naming %q", tc.args, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}
