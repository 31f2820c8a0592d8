package push

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// The gateway's side of the wire: every answer of the handler goes
// through these, so its bodies and headers are the ones parseResponse
// reads.

// WriteSettled answers a settled push with 200.
func WriteSettled(w http.ResponseWriter, s Status, connections int) {
	write(w, http.StatusOK, Response{Status: s, Connections: connections})
}

// WriteRetry answers a push that is to be sent again after retryAfter:
// code is 409 (the id is being pushed) or 503 (unavailable).
func WriteRetry(w http.ResponseWriter, code int, retryAfter time.Duration, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(retryAfter.Round(time.Second)/time.Second))))
	write(w, code, Response{Status: Retry, Error: msg})
}

// WriteRejected answers a request that breaks the contract with 400.
func WriteRejected(w http.ResponseWriter, msg string) {
	write(w, http.StatusBadRequest, Response{Status: Rejected, Error: msg})
}

// WriteUnauthorized answers a request without the right secret with 401.
func WriteUnauthorized(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusUnauthorized)
	json.NewEncoder(w).Encode(map[string]string{"error": "missing or wrong push credentials"})
}

func write(w http.ResponseWriter, code int, r Response) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(r)
}
