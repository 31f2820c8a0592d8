// Package frame is the v1 wire contract between chat clients and the
// gateway: the JSON text frames each side sends. See docs/protocol.md.
package frame

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Client frame types.
const (
	TypePing = "ping"
	TypeAck  = "ack"
	// TypeAuth carries a fresh token for the connection, before the one
	// it was opened with expires.
	TypeAuth = "auth"
)

// Server frame types.
const (
	TypePong  = "pong"
	TypeGuide = "guide"
	TypeError = "error"
	// TypeAuthOK answers an auth frame whose token was taken.
	TypeAuthOK = "auth_ok"
)

// Error codes sent in error frames.
const (
	CodeUnknownType = "unknown_type"
	CodeBadFrame    = "bad_frame"
	CodeUnavailable = "unavailable"
	// CodeBadToken answers an auth frame whose token was refused; the
	// connection keeps the token it had, until that expires.
	CodeBadToken = "bad_token"
)

// Close codes of the gateway's own, beyond RFC 6455's (see
// docs/protocol.md for all of them).
const (
	// CloseTokenExpired ends a connection whose token expired with no
	// fresh one sent in an auth frame. Reconnect with a fresh token.
	CloseTokenExpired = 4001
	// CloseInactive ends a connection after the guide of a close stage:
	// the user was silent through every stage, and the session is over.
	// Do not reconnect on your own; a new chat starts when the user
	// comes back.
	CloseInactive = 4000
)

// MaxIDLen bounds an ack's id; guide ids are 32 hex digits.
const MaxIDLen = 128

// MaxTokenLen bounds an auth frame's token.
const MaxTokenLen = 3072

// MaxActiveAgoMS bounds a ping's active_ago_ms: activity a day old
// concerns no guide an inbox still holds.
const MaxActiveAgoMS = 24 * 60 * 60 * 1000

// Client is a frame from a client.
type Client struct {
	Type  string `json:"type"`
	ID    string `json:"id,omitempty"`
	Token string `json:"token,omitempty"`
	// ActiveAgoMS, on a ping, is how long before it the user was last
	// active without a silence of a full TTL since the last renewal the
	// client had: activity it recorded while it could not reach the
	// gateway. HasActiveAgo says the ping carried one; a value that is
	// not a whole number in [0, MaxActiveAgoMS] is ignored, and the ping
	// renews like any other.
	ActiveAgoMS  int64 `json:"active_ago_ms,omitempty"`
	HasActiveAgo bool  `json:"-"`
}

// ErrInvalidJSON means the payload is not a JSON object. The gateway closes
// the connection with 1007.
var ErrInvalidJSON = errors.New("frame is not a JSON object")

// Parse decodes a client text frame. It fails only on a payload that is not
// a JSON object; an unknown or malformed type is for the caller to answer,
// since the contract keeps the connection open for those.
func Parse(b []byte) (Client, error) {
	if bytes.Equal(b, plainPing) {
		// Nearly every frame: what parse makes of it, without its
		// garbage.
		return Client{Type: TypePing}, nil
	}
	return parse(b)
}

// plainPing is a ping as clients send it, with nothing else to say.
var plainPing = []byte(`{"type":"` + TypePing + `"}`)

// parse is Parse for any payload.
func parse(b []byte) (Client, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || raw == nil {
		return Client{}, ErrInvalidJSON
	}
	var c Client
	// A type or id that is not a string leaves the field empty, which the
	// caller answers as an unknown type or a bad ack.
	_ = json.Unmarshal(raw["type"], &c.Type)
	_ = json.Unmarshal(raw["id"], &c.ID)
	_ = json.Unmarshal(raw["token"], &c.Token)
	if v, ok := raw["active_ago_ms"]; ok {
		var ago *float64 // nil for null
		if json.Unmarshal(v, &ago) == nil && ago != nil && *ago >= 0 && *ago <= MaxActiveAgoMS && *ago == float64(int64(*ago)) {
			c.ActiveAgoMS, c.HasActiveAgo = int64(*ago), true
		}
	}
	return c, nil
}

// Validate checks the fields a known type needs.
func (c Client) Validate() error {
	switch c.Type {
	case TypePing:
		return nil
	case TypeAck:
		if c.ID == "" || len(c.ID) > MaxIDLen {
			return fmt.Errorf("ack needs an id of 1-%d characters", MaxIDLen)
		}
		return nil
	case TypeAuth:
		if c.Token == "" || len(c.Token) > MaxTokenLen {
			return fmt.Errorf("auth needs a token of 1-%d characters", MaxTokenLen)
		}
		return nil
	default:
		return errUnknownType
	}
}

var errUnknownType = errors.New("unknown frame type")

// IsUnknownType reports whether Validate failed on the frame's type.
func IsUnknownType(err error) bool { return errors.Is(err, errUnknownType) }

// Pong answers a ping with the TTL granted, jitter included, and the
// deadline it gives the session (Unix ms, Redis's clock; 0 leaves it out),
// from which a client can tell how far its clock is from Redis's.
func Pong(ttlMS, deadlineMS int64) []byte {
	// Written by hand, one per ping: the bytes encoding/json writes for
	// {type, ttl_ms, deadline_ms omitted when 0} (TestPongAsJSON).
	b := make([]byte, 0, 64)
	b = append(b, `{"type":"`+TypePong+`","ttl_ms":`...)
	b = strconv.AppendInt(b, ttlMS, 10)
	if deadlineMS != 0 {
		b = append(b, `,"deadline_ms":`...)
		b = strconv.AppendInt(b, deadlineMS, 10)
	}
	return append(b, '}')
}

// Guide asks the user whether they are still there, or on a final stage
// says the chat is closed. deadlineMS is when their session ran out (Unix
// ms, Redis's clock), so a client can say when the question was asked; 0
// leaves it out (a guide from an older consumer, which did not say).
// stage is the stage of that silence, from 1 (0 is taken as 1). final is
// true on a close stage: the gateway closes the connection with
// CloseInactive after the frame.
func Guide(id, text string, deadlineMS int64, stage int, final bool) []byte {
	return mustMarshal(struct {
		Type       string `json:"type"`
		ID         string `json:"id"`
		Text       string `json:"text"`
		DeadlineMS int64  `json:"deadline_ms,omitempty"`
		Stage      int    `json:"stage"`
		Final      bool   `json:"final"`
	}{TypeGuide, id, text, deadlineMS, max(stage, 1), final})
}

// AuthOK says the token of an auth frame was taken: the connection now
// lasts until expiresMS (Unix ms), when it is closed with
// CloseTokenExpired unless another fresh token came first.
func AuthOK(expiresMS int64) []byte {
	return mustMarshal(struct {
		Type      string `json:"type"`
		ExpiresMS int64  `json:"expires_ms"`
	}{TypeAuthOK, expiresMS})
}

// Error reports a problem with a frame; the connection stays open.
func Error(code, message string) []byte {
	return mustMarshal(struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message,omitempty"`
	}{TypeError, code, message})
}

func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only fixed struct shapes of strings and ints reach here
	}
	return b
}
