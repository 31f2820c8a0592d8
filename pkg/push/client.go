package push

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Client calls a gateway's push endpoint.
type Client struct {
	url    string
	secret string
	hc     *http.Client
}

// NewClient returns a client of the endpoint at url (a gateway's
// internal listener and Path). hc should not follow redirects: a redirect
// is not an answer, so it is retried.
func NewClient(url, secret string, hc *http.Client) *Client {
	return &Client{url: url, secret: secret, hc: hc}
}

// Error is an answer that does not settle the guide.
type Error struct {
	// Status is Retry or Rejected.
	Status Status
	// Code is the HTTP status, or 0 when the client refused the request
	// before sending it.
	Code int
	// Message is the gateway's "error", if any.
	Message string
	// RetryAfter is the answer's Retry-After, or 0.
	RetryAfter time.Duration
	// Skew marks a 400 from a gateway older than this client, which
	// refused a field it does not know: retried, not rejected.
	Skew bool
}

func (e *Error) Error() string {
	if e.Code == 0 {
		return "invalid request: " + e.Message
	}
	s := strconv.Itoa(e.Code) + " " + http.StatusText(e.Code)
	if e.Skew {
		s += " (gateway older than this consumer)"
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// IsRejected reports whether err is the gateway's definite no: the guide
// breaks the contract, and sending it again cannot help.
func IsRejected(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == Rejected
}

// Push sends one guide and returns the gateway's answer when it settles
// the guide. Any other end is an error: an *Error (see IsRejected), or the
// transport's own, which is to be retried like Retry.
func (c *Client) Push(ctx context.Context, r Request) (Response, error) {
	if err := r.Validate(); err != nil {
		return Response{}, fmt.Errorf("push guide %s: %w", r.ID, &Error{Status: Rejected, Message: err.Error()})
	}
	body, err := json.Marshal(r)
	if err != nil {
		return Response{}, fmt.Errorf("push guide %s: %w", r.ID, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return Response{}, fmt.Errorf("push guide %s: %w", r.ID, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.secret)
	// The push is idempotent per user and id: with this header, the
	// transport also resends it on a kept-alive connection the gateway
	// closed as idle just as the request went out.
	req.Header.Set("Idempotency-Key", r.ID)
	resp, err := c.hc.Do(req)
	if err != nil {
		return Response{}, fmt.Errorf("push guide %s: %w", r.ID, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Response{}, fmt.Errorf("push guide %s: %s: read answer: %w", r.ID, resp.Status, err)
	}
	out, err := parseResponse(resp.StatusCode, resp.Header.Get("Retry-After"), b)
	if err != nil {
		return Response{}, fmt.Errorf("push guide %s: %w", r.ID, err)
	}
	return out, nil
}

// parseResponse reads an answer. Only the HTTP status decides whether a
// guide is rejected: 400 is final, every other non-200 is retried (401
// and 403 too: a wrong secret must not drop guides). A 200 settles the
// guide only with a status this client knows.
func parseResponse(code int, retryAfter string, body []byte) (Response, error) {
	var r Response
	jerr := json.Unmarshal(body, &r)
	switch code {
	case http.StatusOK:
		if jerr != nil {
			return Response{}, &Error{Status: Retry, Code: code, Message: "answer is not a push response"}
		}
		if !r.Status.Settled() {
			return Response{}, &Error{Status: Retry, Code: code, Message: fmt.Sprintf("unknown status %q", r.Status)}
		}
		if r.Connections < 0 {
			r.Connections = 0
		}
		r.Error = ""
		return r, nil
	case http.StatusBadRequest:
		// An older gateway refuses fields it does not know with
		// encoding/json's "json: unknown field": that is our version
		// ahead of its, not a bad guide.
		if strings.Contains(r.Error, "unknown field") {
			return Response{}, &Error{Status: Retry, Code: code, Message: r.Error, Skew: true}
		}
		return Response{}, &Error{Status: Rejected, Code: code, Message: r.Error}
	default:
		e := &Error{Status: Retry, Code: code, Message: r.Error}
		if s, err := strconv.Atoi(strings.TrimSpace(retryAfter)); err == nil && s > 0 && s <= 3600 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
		return Response{}, e
	}
}
