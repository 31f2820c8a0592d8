package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Tolerance is how far a signature's timestamp may be from the receiver's
// clock, either way, for Verify to accept it. The consumer signs each send
// as it goes out, retries included, so a genuine request arrives within
// its send timeout of being signed; the rest is room for clock skew. A
// request captured and replayed later than this is refused.
const Tolerance = 5 * time.Minute

// Bounds of a header ParseSignature reads, so that a hostile one costs
// little.
const (
	maxSignatureLen = 1024
	// maxV1 is the most v1 values: one per secret, and a rotation needs
	// two.
	maxV1 = 4
	// maxKeyLen bounds the key of an element.
	maxKeyLen = 16
)

// Signature is a parsed HeaderSignature.
type Signature struct {
	// Timestamp is when the request was signed, Unix seconds (t=).
	Timestamp int64
	// V1 are the HMAC-SHA256 values (v1=), one per secret it was signed
	// with.
	V1 [][sha256.Size]byte
}

// String is the header value of s: "t=<Timestamp>" and ",v1=<hex>" per V1.
func (s Signature) String() string {
	b := make([]byte, 0, 24+len(s.V1)*(4+2*sha256.Size))
	b = append(b, "t="...)
	b = strconv.AppendInt(b, s.Timestamp, 10)
	for _, m := range s.V1 {
		b = append(b, ",v1="...)
		b = hex.AppendEncode(b, m[:])
	}
	return string(b)
}

// Sign returns the HeaderSignature value of body signed at t under each
// of secrets, one v1 each, in order.
func Sign(body []byte, t time.Time, secrets ...[]byte) string {
	s := Signature{Timestamp: t.Unix()}
	for _, k := range secrets {
		s.V1 = append(s.V1, mac(k, s.Timestamp, body))
	}
	return s.String()
}

// mac is the v1 value: HMAC-SHA256 under secret of "<ts>.<body>".
func mac(secret []byte, ts int64, body []byte) [sha256.Size]byte {
	m := hmac.New(sha256.New, secret)
	m.Write(strconv.AppendInt(nil, ts, 10))
	m.Write([]byte{'.'})
	m.Write(body)
	var out [sha256.Size]byte
	m.Sum(out[:0])
	return out
}

// ParseSignature reads a HeaderSignature value, strictly: elements
// key=value separated by commas, no spaces; exactly one t, a Unix time in
// seconds written in decimal without sign or leading zero; one to four
// v1, each 64 hex digits. Elements with another key (1-16 characters of
// a-z and 0-9) are skipped, so that a later scheme can be sent beside v1.
// Anything else is an error naming the element.
func ParseSignature(header string) (Signature, error) {
	switch {
	case header == "":
		return Signature{}, errors.New(HeaderSignature + ": empty")
	case len(header) > maxSignatureLen:
		return Signature{}, fmt.Errorf("%s: %d bytes, want at most %d", HeaderSignature, len(header), maxSignatureLen)
	}
	var (
		s     Signature
		haveT bool
	)
	for part := range strings.SplitSeq(header, ",") {
		key, val, ok := strings.Cut(part, "=")
		if !ok || !validKey(key) {
			return Signature{}, fmt.Errorf("%s: element %s: want key=value with a key of 1-%d characters of a-z and 0-9", HeaderSignature, quote(part), maxKeyLen)
		}
		switch key {
		case "t":
			if haveT {
				return Signature{}, fmt.Errorf("%s: t: given twice", HeaderSignature)
			}
			ts, err := parseTimestamp(val)
			if err != nil {
				return Signature{}, fmt.Errorf("%s: t: %w", HeaderSignature, err)
			}
			s.Timestamp, haveT = ts, true
		case "v1":
			if len(s.V1) == maxV1 {
				return Signature{}, fmt.Errorf("%s: v1: more than %d", HeaderSignature, maxV1)
			}
			var m [sha256.Size]byte
			if len(val) != hex.EncodedLen(len(m)) {
				return Signature{}, fmt.Errorf("%s: v1: %s: want %d hex digits", HeaderSignature, quote(val), hex.EncodedLen(len(m)))
			}
			if _, err := hex.Decode(m[:], []byte(val)); err != nil {
				return Signature{}, fmt.Errorf("%s: v1: %s: want %d hex digits", HeaderSignature, quote(val), hex.EncodedLen(len(m)))
			}
			s.V1 = append(s.V1, m)
		}
	}
	switch {
	case !haveT:
		return Signature{}, fmt.Errorf("%s: no t", HeaderSignature)
	case len(s.V1) == 0:
		return Signature{}, fmt.Errorf("%s: no v1", HeaderSignature)
	}
	return s, nil
}

func validKey(k string) bool {
	if k == "" || len(k) > maxKeyLen {
		return false
	}
	for i := range len(k) {
		if c := k[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// parseTimestamp reads positive decimal seconds in their one spelling:
// the MAC covers the digits as sent, so "+5" or "05" for 5 would be a
// second spelling of a signed value.
func parseTimestamp(v string) (int64, error) {
	bad := func() (int64, error) {
		return 0, fmt.Errorf("%s: want Unix seconds in decimal", quote(v))
	}
	if v == "" || v[0] == '0' {
		return bad()
	}
	for i := range len(v) {
		if v[i] < '0' || v[i] > '9' {
			return bad()
		}
	}
	ts, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return bad()
	}
	return ts, nil
}

// quote quotes s for an error, cut short: it comes from the request.
func quote(s string) string {
	const limit = 40
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "..."
	}
	return strconv.Quote(s)
}

// Verify checks a request the consumer sent. header, its HeaderSignature,
// must parse (see ParseSignature), carry a timestamp within Tolerance of
// now, and carry a v1 that is the HMAC of that timestamp and body under
// one of secrets; passing the old and the new secret accepts both while
// the consumer's is rotated. Verify the raw body before parsing it, and
// answer a request it refuses with 401: the consumer retries it rather
// than dropping the guide. The error says why, never with a secret.
func Verify(header string, body []byte, now time.Time, secrets ...[]byte) error {
	if len(secrets) == 0 {
		return errors.New("verify " + HeaderSignature + ": no secret given")
	}
	for i, k := range secrets {
		if len(k) == 0 {
			return fmt.Errorf("verify %s: secret %d is empty", HeaderSignature, i)
		}
	}
	s, err := ParseSignature(header)
	if err != nil {
		return err
	}
	switch age := now.Sub(time.Unix(s.Timestamp, 0)); {
	case age > Tolerance:
		return fmt.Errorf("%s: t: signed %v ago, more than the %v tolerance", HeaderSignature, age.Round(time.Second), Tolerance)
	case age < -Tolerance:
		return fmt.Errorf("%s: t: signed %v ahead of this clock, more than the %v tolerance", HeaderSignature, age.Abs().Round(time.Second), Tolerance)
	}
	ok := 0
	for _, k := range secrets {
		want := mac(k, s.Timestamp, body)
		for _, got := range s.V1 {
			ok |= subtle.ConstantTimeCompare(got[:], want[:])
		}
	}
	if ok == 0 {
		return fmt.Errorf("%s: no v1 matches the body under the secret", HeaderSignature)
	}
	return nil
}
