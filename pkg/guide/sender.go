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
	Send(ctx context.Context, g Guide) (Sent, error)
}

// Sent is how a downstream settled a guide: its outcome and, for the
// user's timeline, how many connections the gateway handed it to, or the
// webhook's HTTP status.
type Sent struct {
	Outcome Outcome
	Conns   int // the gateway's: connections that took it
	Code    int // the webhook's: its 2xx
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
// breaker. code is the downstream's HTTP status, 0 when it never answered.
type permanentError struct {
	err  error
	code int
}

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

func isPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// permanentCode is the HTTP status of a permanentError, or 0.
func permanentCode(err error) int {
	var p permanentError
	if errors.As(err, &p) {
		return p.code
	}
	return 0
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
func (s *gatewaySender) Send(ctx context.Context, g Guide) (Sent, error) {
	res, err := push.NewClient(s.url, s.secret, s.client).Push(ctx, g)
	if push.IsRejected(err) {
		var pe *push.Error
		errors.As(err, &pe)
		return Sent{}, permanentError{err, pe.Code}
	}
	if err != nil {
		return Sent{}, err
	}
	return Sent{Outcome: Outcome(res.Status), Conns: res.Connections}, nil
}
