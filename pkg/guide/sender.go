package guide

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Guide is one message to deliver.
type Guide struct {
	ID         string // the timeout event's id: the idempotency key
	UID        string
	Segment    string
	Text       string
	DeadlineMS int64 // when the session ran out, Unix ms
}

// Outcomes of a settled guide, the label of stillthere_consumer_guides_total.
const (
	OutcomeDelivered = "delivered" // shown to the user
	OutcomeDuplicate = "duplicate" // shown before: the downstream deduped it
	OutcomeQueued    = "queued"    // the user had no connection: kept for their next connect
	OutcomeStale     = "stale"     // the user came back before the guide went out
	OutcomeTooOld    = "too_old"   // the deadline is older than guide-max-age: dropped
	OutcomeRejected  = "rejected"  // the downstream refused it for good (4xx): dead-lettered
	OutcomeInvalid   = "invalid"   // not a timeout event this build reads: dead-lettered
)

// sender delivers one guide and says how it was settled. An error is the
// downstream failing, to be retried, unless it is a permanentError.
type sender interface {
	Send(ctx context.Context, g Guide) (string, error)
}

var (
	_ sender = (*gatewaySender)(nil)
	_ sender = (*webhookSender)(nil)
)

// permanentError is a downstream's definite no: retrying cannot help, and
// the downstream is healthy, so the breaker counts it as a success.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

func isPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// gatewaySender delivers guides through the gateway's push endpoint, which
// dedupes on the guide id.
type gatewaySender struct {
	url    string
	secret string
	client *http.Client
}

// Send pushes g and returns its outcome. Errors other than permanentError
// are the downstream failing: 5xx, 401/403 (a misconfigured secret must
// not drop guides), 429, timeouts and connection errors.
func (s *gatewaySender) Send(ctx context.Context, g Guide) (string, error) {
	// The push endpoint refuses unknown fields: only these three.
	body, err := json.Marshal(map[string]string{"id": g.ID, "uid": g.UID, "text": g.Text})
	if err != nil {
		return "", permanentError{err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return "", permanentError{err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.secret)
	resp, err := s.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("push guide %s: %w", g.ID, err)
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&out)
	switch {
	case resp.StatusCode == http.StatusOK &&
		(out.Status == OutcomeDelivered || out.Status == OutcomeDuplicate || out.Status == OutcomeQueued):
		return out.Status, nil
	case resp.StatusCode == http.StatusBadRequest:
		return "", permanentError{fmt.Errorf("push guide %s: %s: %s", g.ID, resp.Status, out.Error)}
	default:
		return "", fmt.Errorf("push guide %s: %s %s", g.ID, resp.Status, out.Error)
	}
}
