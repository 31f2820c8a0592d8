// Package token verifies and mints the HS256 JWTs that clients present to
// the gateway. A token's "sub" is the user id, "exp" is required, and the
// optional "seg" names the user's segment.
package token

import (
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/stillthere/stillthere/pkg/session"
)

// MinSecretLen is the shortest HS256 secret accepted: 32 bytes, the size of
// the hash, as RFC 7518 section 3.2 requires.
const MinSecretLen = 32

// Claims are what a verified token says about its holder.
type Claims struct {
	UID     string
	Segment string // session.DefaultSegment when the token names none
	Expires time.Time
}

type jwtClaims struct {
	Seg string `json:"seg,omitempty"`
	jwt.RegisteredClaims
}

// Verifier checks tokens against one secret.
type Verifier struct {
	secret []byte
	parser *jwt.Parser
}

// NewVerifier returns a Verifier for secret.
func NewVerifier(secret []byte) (*Verifier, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("token secret is %d bytes, want at least %d", len(secret), MinSecretLen)
	}
	return &Verifier{
		secret: secret,
		parser: jwt.NewParser(
			jwt.WithValidMethods([]string{"HS256"}), // rejects alg none and key confusion
			jwt.WithExpirationRequired(),
			jwt.WithLeeway(5*time.Second),
		),
	}, nil
}

// Verify checks raw and returns its claims. Its errors are safe to show to
// the client: they never contain the token.
func (v *Verifier) Verify(raw string) (Claims, error) {
	if raw == "" {
		return Claims{}, errors.New("missing token")
	}
	var c jwtClaims
	_, err := v.parser.ParseWithClaims(raw, &c, func(*jwt.Token) (any, error) { return v.secret, nil })
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return Claims{}, errors.New("token expired")
	case errors.Is(err, jwt.ErrTokenMalformed):
		return Claims{}, errors.New("malformed token")
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		return Claims{}, errors.New("invalid token signature or algorithm")
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return Claims{}, errors.New("token has no exp claim")
	case err != nil:
		return Claims{}, errors.New("invalid token")
	}
	if !session.ValidUID(c.Subject) {
		return Claims{}, errors.New("token sub must be 1-128 characters of [A-Za-z0-9._:@-]")
	}
	seg := c.Seg
	if seg == "" {
		seg = session.DefaultSegment
	} else if !session.ValidSegment(seg) {
		return Claims{}, errors.New("token seg must be 1-64 characters of [A-Za-z0-9._-]")
	}
	return Claims{UID: c.Subject, Segment: seg, Expires: c.ExpiresAt.Time}, nil
}

// Mint signs a token for uid, valid for ttl. It serves the dev stack, the
// tests and load tests; production tokens come from the platform's login.
func Mint(secret []byte, uid, segment string, ttl time.Duration) (string, error) {
	if !session.ValidUID(uid) {
		return "", fmt.Errorf("mint token: invalid uid %q", uid)
	}
	if segment != "" && !session.ValidSegment(segment) {
		return "", fmt.Errorf("mint token: invalid segment %q", segment)
	}
	now := time.Now()
	c := jwtClaims{
		Seg: segment,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   uid,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}
