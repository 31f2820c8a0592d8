package expiry

import (
	"net/http"
	"testing"
)

// TestProfilesOnlyWhenTurnedOn: the admin listener, which the metrics
// scrapers reach, serves no profile or trace unless pprof is on.
func TestProfilesOnlyWhenTurnedOn(t *testing.T) {
	h := newHarness(t)
	for _, tt := range []struct {
		name  string
		pprof bool
		want  map[string]int
	}{
		{"off by default", false, map[string]int{
			"/debug/pprof/":        http.StatusNotFound,
			"/debug/pprof/profile": http.StatusNotFound,
			"/debug/pprof/trace":   http.StatusNotFound,
			"/healthz":             http.StatusOK,
		}},
		{"on", true, map[string]int{
			"/debug/pprof/": http.StatusOK,
			"/healthz":      http.StatusOK,
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := h.config(ModeSweep)
			cfg.Pprof = tt.pprof
			l, stop := h.startListener(cfg)
			defer stop()
			for path, want := range tt.want {
				resp, err := http.Get("http://" + l.AdminAddr().String() + path)
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
