package guide

import (
	"context"
	"errors"
	"net/http"

	"github.com/stillthere/stillthere/pkg/push"
)

// Guide is one message to deliver: the push request, whose ID (the
// timeout event's id) is the idempotency key and whose DeadlineMS is when
// the session ran out.
type Guide = push.Request

// sender delivers one guide and says how it was settled. An error is the
// downstream failing, to be retried, unless it is a permanentError.
type sender interface {
	Send(ctx context.Context, g Guide) (Outcome, error)
}

var (
	_ sender = (*gatewaySender)(nil)
	_ sender = (*webhookSender)(nil)
)

// permanentError is a downstream's definite no to one guide: retrying
// cannot help, and the downstream is healthy, so the breaker counts it as
// a success. Only answers about the guide itself are one (the push
// endpoint's 400; the webhook's 400, 404, 410, 422), never a refusal of
// our credentials (401, 403): that one every guide gets, and as a success
// it would dead-letter them all at full speed instead of opening the
// breaker.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

func isPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// gatewaySender delivers guides through the gateway's push endpoint, which
// dedupes on the user and guide id: a thin use of push.Client.
type gatewaySender struct {
	url    string
	secret string
	client *http.Client
}

// Send pushes g and returns its outcome. The gateway's definite no (400)
// is a permanentError; everything else that does not settle the guide
// (409 while another push of it is under way, 5xx, 401/403, an older
// gateway refusing a field, timeouts, connection errors) is the
// downstream failing, to be retried.
func (s *gatewaySender) Send(ctx context.Context, g Guide) (Outcome, error) {
	res, err := push.NewClient(s.url, s.secret, s.client).Push(ctx, g)
	if push.IsRejected(err) {
		return "", permanentError{err}
	}
	if err != nil {
		return "", err
	}
	return Outcome(res.Status), nil
}
