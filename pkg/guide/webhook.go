package guide

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/webhook"
)

// webhookSender POSTs guides to a platform whose IM API lives elsewhere,
// or notify stages to the platform's notify webhook, as package webhook
// describes.
type webhookSender struct {
	url    string
	secret []byte
	client *http.Client
	what   string // what it sends, for errors: "webhook guide" when empty
}

// Send posts g, signed as it goes out: a retry is a new request with a
// fresh timestamp. Any 2xx delivers it; a final answer (webhook.Final:
// 400, 404, 410, 422) is the receiver's definite no (permanentError).
// Everything else is the receiver failing, to be retried: 401 and 403,
// which a rotated secret gets for every guide, as much as 5xx, timeouts
// and connection errors.
func (s *webhookSender) Send(ctx context.Context, g Guide) (Sent, error) {
	// A guide without a stage (0, "") is stage 1's reminder, as on the
	// push endpoint: the webhook's receiver always gets all three.
	// A close stage is always the last, with its reason.
	reason := g.Reason
	if g.Final && reason == "" {
		reason = timeoutevent.ReasonEnded
	}
	body, err := json.Marshal(webhook.Body{ID: g.ID, UID: g.UID, Segment: g.Segment, Text: g.Text, DeadlineMS: g.DeadlineMS, DueMS: cmp.Or(g.DueMS, g.DeadlineMS),
		Stage: max(g.Stage, 1), Action: cmp.Or(g.Action, timeoutevent.ActionRemind), Final: reason != "", Reason: reason})
	if err != nil {
		return Sent{}, permanentError{err, 0}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return Sent{}, permanentError{err, 0}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.HeaderIdempotencyKey, g.ID)
	req.Header.Set(webhook.HeaderSignature, webhook.Sign(body, time.Now(), s.secret))
	resp, err := s.client.Do(req)
	if err != nil {
		return Sent{}, fmt.Errorf("%s %s: %w", cmp.Or(s.what, "webhook guide"), g.ID, err)
	}
	defer resp.Body.Close()
	// Drain a little so the connection can be reused.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return Sent{Outcome: OutcomeDelivered, Code: code}, nil
	case webhook.Final(code):
		return Sent{}, permanentError{fmt.Errorf("%s %s: %s", cmp.Or(s.what, "webhook guide"), g.ID, resp.Status), code}
	default:
		return Sent{}, fmt.Errorf("%s %s: %w", cmp.Or(s.what, "webhook guide"), g.ID, answerError(resp.Status))
	}
}

// answerError is a receiver's answer that failed a send: it took the
// request, and says it did not take the guide.
type answerError string

func (e answerError) Error() string { return string(e) }
