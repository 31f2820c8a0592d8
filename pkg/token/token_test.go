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
	v, err := NewVerifier(secret, Rules{})
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

func TestVerifyRules(t *testing.T) {
	v, err := NewVerifier(secret, Rules{Issuer: "https://login.example", Audience: "stillthere", MaxLifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	claims := func(extra jwt.MapClaims) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "alice", "iss": "https://login.example", "aud": "stillthere",
			"iat": now.Unix(), "exp": now.Add(30 * time.Minute).Unix()}
		for k, val := range extra {
			if val == nil {
				delete(c, k)
			} else {
				c[k] = val
			}
		}
		return c
	}
	tests := []struct {
		name    string
		claims  jwt.MapClaims
		wantErr string
	}{
		{"good", claims(nil), ""},
		{"aud among several", claims(jwt.MapClaims{"aud": []string{"other", "stillthere"}}), ""},
		{"no iat: lifetime from now", claims(jwt.MapClaims{"iat": nil}), ""},
		{"lifetime at the limit", claims(jwt.MapClaims{"exp": now.Add(time.Hour).Unix()}), ""},
		{"wrong iss", claims(jwt.MapClaims{"iss": "https://evil.example"}), "token iss"},
		{"no iss", claims(jwt.MapClaims{"iss": nil}), "no iss claim"},
		{"wrong aud", claims(jwt.MapClaims{"aud": "other"}), "token aud"},
		{"no aud", claims(jwt.MapClaims{"aud": nil}), "no aud claim"},
		{"lifetime too long", claims(jwt.MapClaims{"exp": now.Add(2 * time.Hour).Unix()}), "lifetime"},
		{"no iat, too long from now", claims(jwt.MapClaims{"iat": nil, "exp": now.Add(2 * time.Hour).Unix()}), "lifetime"},
		{"iat in the future", claims(jwt.MapClaims{"iat": now.Add(time.Minute).Unix()}), "iat"},
		{"old iat stretches nothing", claims(jwt.MapClaims{"iat": now.Add(-50 * time.Minute).Unix(), "exp": now.Add(20 * time.Minute).Unix()}), "lifetime"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := v.Verify(sign(t, jwt.SigningMethodHS256, secret, tt.claims))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Verify = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
	// Without rules, the same checks are off: an issuer's token without
	// iss or aud, of any lifetime, is fine.
	open, _ := NewVerifier(secret, Rules{})
	if _, err := open.Verify(sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "exp": now.Add(48 * time.Hour).Unix()})); err != nil {
		t.Fatalf("no rules: %v", err)
	}
	if _, err := NewVerifier(secret, Rules{MaxLifetime: -time.Second}); err == nil {
		t.Fatal("NewVerifier accepted a negative max lifetime")
	}
}

// TestMintFor: a token minted with an issuer and an audience passes the
// rules that require them; one minted without fails them.
func TestMintFor(t *testing.T) {
	v, err := NewVerifier(secret, Rules{Issuer: "https://login.example", Audience: "stillthere", MaxLifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := MintFor(secret, "canary-1", "canary", 30*time.Minute, Issued{Issuer: "https://login.example", Audience: "stillthere"})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := v.Verify(tok); err != nil || c.UID != "canary-1" || c.Segment != "canary" {
		t.Fatalf("Verify = %+v, %v; want canary-1 in segment canary", c, err)
	}
	tok, err = Mint(secret, "canary-1", "canary", 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(tok); err == nil || !strings.Contains(err.Error(), "no iss claim") {
		t.Fatalf("Verify of a token without iss = %v, want it refused", err)
	}
}

func TestShortSecretRejected(t *testing.T) {
	if _, err := NewVerifier([]byte("short"), Rules{}); err == nil {
		t.Fatal("NewVerifier accepted a 5-byte secret")
	}
}

func FuzzVerify(f *testing.F) {
	v, _ := NewVerifier(secret, Rules{})
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
	v, _ := NewVerifier(secret, Rules{})
	raw, _ := Mint(secret, "alice", "vip", time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(raw); err != nil {
			b.Fatal(err)
		}
	}
}
