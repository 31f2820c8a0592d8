package guide

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// Webhook request headers.
const (
	// HeaderIdempotencyKey carries the guide id: the same for every send of
	// one silence, so the receiver shows it once.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderSignature is "sha256=" and the hex HMAC-SHA256 of the body
	// under the webhook secret.
	HeaderSignature = "X-Stillthere-Signature"
)

// webhookBody is the JSON a webhook receives.
type webhookBody struct {
	ID         string `json:"id"`
	UID        string `json:"uid"`
	Segment    string `json:"segment"`
	Text       string `json:"text"`
	DeadlineMS int64  `json:"deadline_ms"`
}

// webhookSender POSTs guides to a platform whose IM API lives elsewhere.
type webhookSender struct {
	url    string
	secret []byte
	client *http.Client
}

// Sign returns the HeaderSignature value of body under secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Send posts g. Any 2xx delivers it. 408, 429, 5xx, other statuses,
// timeouts and connection errors are the downstream failing; any other
// 4xx is its definite no (permanentError).
func (s *webhookSender) Send(ctx context.Context, g Guide) (string, error) {
	body, err := json.Marshal(webhookBody{ID: g.ID, UID: g.UID, Segment: g.Segment, Text: g.Text, DeadlineMS: g.DeadlineMS})
	if err != nil {
		return "", permanentError{err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return "", permanentError{err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderIdempotencyKey, g.ID)
	req.Header.Set(HeaderSignature, Sign(s.secret, body))
	resp, err := s.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("webhook guide %s: %w", g.ID, err)
	}
	defer resp.Body.Close()
	// Drain a little so the connection can be reused.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return OutcomeDelivered, nil
	case code >= 400 && code < 500 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests:
		return "", permanentError{fmt.Errorf("webhook guide %s: %s", g.ID, resp.Status)}
	default:
		return "", fmt.Errorf("webhook guide %s: %s", g.ID, resp.Status)
	}
}
