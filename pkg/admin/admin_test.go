package admin

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestMux(t *testing.T) {
	for _, tt := range []struct {
		name     string
		profiles bool
		path     string
		want     int
	}{
		{"health", false, "/healthz", http.StatusOK},
		{"readiness", false, "/readyz", http.StatusOK},
		{"metrics", false, "/metrics", http.StatusOK},
		{"no profile index by default", false, "/debug/pprof/", http.StatusNotFound},
		{"no heap profile by default", false, "/debug/pprof/heap", http.StatusNotFound},
		{"no CPU profile by default", false, "/debug/pprof/profile", http.StatusNotFound},
		{"no trace by default", false, "/debug/pprof/trace", http.StatusNotFound},
		{"profile index when on", true, "/debug/pprof/", http.StatusOK},
		{"heap profile when on", true, "/debug/pprof/heap", http.StatusOK},
		{"trace when on", true, "/debug/pprof/trace?seconds=0.05", http.StatusOK},
		{"health with profiles on", true, "/healthz", http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(NewMux(func(context.Context) error { return nil }, tt.profiles))
			defer srv.Close()
			resp, err := http.Get(srv.URL + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("GET %s with profiles %v: %s, want %d", tt.path, tt.profiles, resp.Status, tt.want)
			}
		})
	}
}

func TestReadyzReportsTheCheck(t *testing.T) {
	srv := httptest.NewServer(NewMux(func(context.Context) error { return errors.New("redis down") }, false))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("readyz with a failing check: %s, want 503", resp.Status)
	}
}
