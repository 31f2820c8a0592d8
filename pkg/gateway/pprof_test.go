package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// TestProfilesOnlyWhenTurnedOn: the internal listener, which the metrics
// scrapers reach too, serves no profile or trace unless pprof is on.
func TestProfilesOnlyWhenTurnedOn(t *testing.T) {
	for _, tt := range []struct {
		name  string
		pprof bool
		want  map[string]int
	}{
		{"off by default", false, map[string]int{
			"/debug/pprof/":        http.StatusNotFound,
			"/debug/pprof/profile": http.StatusNotFound,
			"/debug/pprof/trace":   http.StatusNotFound,
			"/metrics":             http.StatusOK,
		}},
		{"on", true, map[string]int{
			"/debug/pprof/":     http.StatusOK,
			"/debug/pprof/heap": http.StatusOK,
			"/metrics":          http.StatusOK,
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tg := startGateway(t, func(c *Config) { c.Pprof = tt.pprof })
			for path, want := range tt.want {
				resp, err := http.Get("http://" + tg.PushAddr().String() + path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("GET %s: %s, want %d", path, resp.Status, want)
				}
			}
		})
	}
}

func TestPprofSetting(t *testing.T) {
	for _, tt := range []struct {
		value string // of STILLTHERE_PPROF; "" leaves it unset
		want  bool
		err   string
	}{
		{"", false, ""},
		{"false", false, ""},
		{"true", true, ""},
		{"yes", false, `STILLTHERE_PPROF="yes"`},
	} {
		env := map[string]string{"STILLTHERE_TOKEN_SECRET": tokenSecret, "STILLTHERE_PUSH_SECRET": pushSecret, "STILLTHERE_PPROF": tt.value}
		c, err := LoadConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("STILLTHERE_PPROF=%q: %v, want an error naming %s", tt.value, err, tt.err)
		case tt.err == "" && err != nil:
			t.Errorf("STILLTHERE_PPROF=%q: %v", tt.value, err)
		case tt.err == "" && c.Pprof != tt.want:
			t.Errorf("STILLTHERE_PPROF=%q: Pprof %v, want %v", tt.value, c.Pprof, tt.want)
		}
	}
}
