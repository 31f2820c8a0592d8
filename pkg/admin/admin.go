// Package admin serves the health and metrics endpoints every service
// exposes on its internal listener: /healthz (the process is up), /readyz
// (its dependencies answer), /metrics (Prometheus) and, when a service's
// pprof setting is on, /debug/pprof/.
package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check reports whether a dependency is usable; nil means ready.
type Check func(ctx context.Context) error

// NewMux returns a mux with /healthz, /readyz and /metrics, and with
// profiles the pprof endpoints. Callers add their own routes to it.
func NewMux(ready Check, profiles bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ready(ctx); err != nil {
			WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": err.Error()})
			return
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", promhttp.Handler())
	if profiles {
		// Off unless asked for: the listener has no authentication, and
		// a profile or a trace costs CPU while it runs and shows the
		// process's internals to whoever can reach the port, which in a
		// cluster includes the metrics scrapers. Turned on to look at one
		// instance: go tool pprof http://<addr>/debug/pprof/heap
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// WriteJSON writes v as a JSON response with the given status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// WriteError writes {"error": msg}.
func WriteError(w http.ResponseWriter, status int, msg string) {
	WriteJSON(w, status, map[string]string{"error": msg})
}
