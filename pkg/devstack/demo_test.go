package devstack

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// TestBannerPrintsDemoPage: the dev stack serves the demo page and prints
// its URL, with the dev token in the fragment; STILLTHERE_DEMO_PAGE=false
// turns both off.
func TestBannerPrintsDemoPage(t *testing.T) {
	for _, tt := range []struct {
		name   string
		extra  map[string]string
		served bool
	}{
		{"on by default", nil, true},
		{"turned off", map[string]string{"STILLTHERE_DEMO_PAGE": "false"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startStack(t, tt.extra)
			var banner bytes.Buffer
			s.Banner(&banner)
			page := "http://" + s.Gateway.PublicAddr().String() + "/demo/"
			want := page + "#token=" + s.DevToken
			if got := strings.Contains(banner.String(), want); got != tt.served {
				t.Errorf("banner shows %s: %v, want %v; banner:\n%s", want, got, tt.served, banner.String())
			}
			resp, err := http.Get(page)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if served := resp.StatusCode == http.StatusOK; served != tt.served {
				t.Errorf("GET %s: %s; want it served: %v", page, resp.Status, tt.served)
			}
		})
	}
}
