package token

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func sign(t *testing.T, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestVerify(t *testing.T) {
	v, err := NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour).Unix()
	good, _ := Mint(secret, "alice", "vip", time.Hour)
	noSeg, _ := Mint(secret, "bob@x.io", "", time.Hour)
	unsigned := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"alice","exp":9999999999}`)) + "."

	tests := []struct {
		name    string
		raw     string
		wantUID string
		wantSeg string
		wantErr string
	}{
		{"good", good, "alice", "vip", ""},
		{"default segment", noSeg, "bob@x.io", "default", ""},
		{"missing", "", "", "", "missing token"},
		{"malformed", "abc.def", "", "", "malformed"},
		{"alg none", unsigned, "", "", "signature or algorithm"},
		{"wrong secret", sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("z", 32)), jwt.MapClaims{"sub": "a", "exp": exp}), "", "", "signature"},
		{"HS512", sign(t, jwt.SigningMethodHS512, secret, jwt.MapClaims{"sub": "a", "exp": exp}), "", "", "signature or algorithm"},
		{"expired", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "exp": time.Now().Add(-time.Minute).Unix()}), "", "", "expired"},
		{"no exp", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a"}), "", "", "exp"},
		{"no sub", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp}), "", "", "sub"},
		{"bad sub", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a b", "exp": exp}), "", "", "sub"},
		{"long sub", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": strings.Repeat("a", 129), "exp": exp}), "", "", "sub"},
		{"bad seg", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "exp": exp, "seg": "v:ip"}), "", "", "seg"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := v.Verify(tt.raw)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Verify = %+v, %v; want error containing %q", c, err, tt.wantErr)
				}
				if tt.raw != "" && strings.Contains(err.Error(), tt.raw) {
					t.Fatal("error message contains the token")
				}
				return
			}
			if err != nil || c.UID != tt.wantUID || c.Segment != tt.wantSeg {
				t.Fatalf("Verify = %+v, %v; want uid %q seg %q", c, err, tt.wantUID, tt.wantSeg)
			}
		})
	}
}

func TestShortSecretRejected(t *testing.T) {
	if _, err := NewVerifier([]byte("short")); err == nil {
		t.Fatal("NewVerifier accepted a 5-byte secret")
	}
}

func FuzzVerify(f *testing.F) {
	v, _ := NewVerifier(secret)
	good, _ := Mint(secret, "alice", "vip", time.Hour)
	f.Add(good)
	f.Add("a.b.c")
	f.Add("")
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := v.Verify(raw)
		if err != nil {
			return
		}
		// Only a token signed with the secret gets through: re-signing its
		// header and payload must give the same signature.
		parts := strings.Split(raw, ".")
		if len(parts) != 3 || c.UID == "" {
			t.Fatalf("accepted %q as %+v", raw, c)
		}
		sig, err := jwt.SigningMethodHS256.Sign(parts[0]+"."+parts[1], secret)
		if err != nil || base64.RawURLEncoding.EncodeToString(sig) != strings.TrimRight(parts[2], "=") {
			t.Fatalf("accepted %q with a signature that is not ours", raw)
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	v, _ := NewVerifier(secret)
	raw, _ := Mint(secret, "alice", "vip", time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(raw); err != nil {
			b.Fatal(err)
		}
	}
}
