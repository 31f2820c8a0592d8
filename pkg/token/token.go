// Package token verifies and mints the HS256 JWTs that clients present to
// the gateway. A token's "sub" is the user id, "exp" is required, and the
// optional "seg" names the user's segment. A Verifier can also require an
// issuer ("iss"), an audience ("aud") and a maximum lifetime.
package token

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/stillthere/stillthere/pkg/userid"
)

// MinSecretLen is the shortest HS256 secret accepted: 32 bytes, the size of
// the hash, as RFC 7518 section 3.2 requires.
const MinSecretLen = 32

// Claims are what a verified token says about its holder.
type Claims struct {
	UID     string
	Segment string // userid.DefaultSegment when the token names none
	Expires time.Time
}

type jwtClaims struct {
	Seg string `json:"seg,omitempty"`
	jwt.RegisteredClaims
}

// Rules are what a Verifier requires of a token beyond its signature and
// exp. The zero value requires nothing more.
type Rules struct {
	// Issuer, when set, must be the token's "iss".
	Issuer string
	// Audience, when set, must be among the token's "aud".
	Audience string
	// MaxLifetime, when set, bounds a token's lifetime: from its "iat" to
	// its "exp", or from now when it has no "iat". A stolen token is then
	// worth at most this long, whatever its issuer wrote.
	MaxLifetime time.Duration
}

// Leeway is the clock skew between the token's issuer and the gateway that
// exp, iat and the maximum lifetime allow.
const Leeway = 5 * time.Second

// Verifier checks tokens against one secret and its rules.
type Verifier struct {
	secret []byte
	rules  Rules
	parser *jwt.Parser
}

// NewVerifier returns a Verifier for secret that enforces rules.
func NewVerifier(secret []byte, rules Rules) (*Verifier, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("token secret is %d bytes, want at least %d", len(secret), MinSecretLen)
	}
	if rules.MaxLifetime < 0 {
		return nil, fmt.Errorf("token max lifetime is %v, want 0 (none) or more", rules.MaxLifetime)
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods([]string{"HS256"}), // rejects alg none and key confusion
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(), // an iat in the future is refused
		jwt.WithLeeway(Leeway),
	}
	if rules.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(rules.Issuer))
	}
	if rules.Audience != "" {
		opts = append(opts, jwt.WithAudience(rules.Audience))
	}
	return &Verifier{secret: secret, rules: rules, parser: jwt.NewParser(opts...)}, nil
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
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return Claims{}, errors.New("token iss is not the one this gateway accepts")
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return Claims{}, errors.New("token aud does not name this gateway")
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return Claims{}, errors.New("token iat is in the future")
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return Claims{}, errors.New("token nbf is in the future")
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		// exp always, iss and aud when the rules name them; the parser
		// says which only in its message.
		for _, claim := range []string{"iss", "aud"} {
			if strings.Contains(err.Error(), claim+" claim is required") {
				return Claims{}, fmt.Errorf("token has no %s claim", claim)
			}
		}
		return Claims{}, errors.New("token has no exp claim")
	case err != nil:
		return Claims{}, errors.New("invalid token")
	}
	if !userid.Valid(c.Subject) {
		return Claims{}, errors.New("token sub must be 1-128 characters of [A-Za-z0-9._:@-]")
	}
	seg := c.Seg
	if seg == "" {
		seg = userid.DefaultSegment
	} else if !userid.ValidSegment(seg) {
		return Claims{}, errors.New("token seg must be 1-64 characters of [A-Za-z0-9._-]")
	}
	if max := v.rules.MaxLifetime; max > 0 {
		from := time.Now()
		if c.IssuedAt != nil {
			from = c.IssuedAt.Time
		}
		if life := c.ExpiresAt.Sub(from); life > max+Leeway {
			return Claims{}, fmt.Errorf("token lifetime %v is longer than the %v allowed", life.Round(time.Second), max)
		}
	}
	return Claims{UID: c.Subject, Segment: seg, Expires: c.ExpiresAt.Time}, nil
}

// Mint signs a token for uid, valid for ttl. It serves the dev stack, the
// tests and load tests; production tokens come from the platform's login.
func Mint(secret []byte, uid, segment string, ttl time.Duration) (string, error) {
	return MintFor(secret, uid, segment, ttl, Issued{})
}

// Issued is what a minted token names as its issuer (iss) and audience
// (aud), for gateways whose Rules require them; empty names none.
type Issued struct {
	Issuer, Audience string
}

// MintFor is Mint with an issuer and an audience: the canary's tokens
// must pass a production gateway's rules.
func MintFor(secret []byte, uid, segment string, ttl time.Duration, by Issued) (string, error) {
	if !userid.Valid(uid) {
		return "", fmt.Errorf("mint token: invalid uid %q", uid)
	}
	if segment != "" && !userid.ValidSegment(segment) {
		return "", fmt.Errorf("mint token: invalid segment %q", segment)
	}
	now := time.Now()
	c := jwtClaims{
		Seg: segment,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   uid,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
			Issuer:    by.Issuer,
		},
	}
	if by.Audience != "" {
		c.Audience = jwt.ClaimStrings{by.Audience}
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}
