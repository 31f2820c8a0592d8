package webhook_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/webhook"
)

// The receiver code README.md shows, verbatim between the markers:
// TestREADMEReceiver checks the README still shows it, and that it accepts
// and refuses what Verify does.

// README receiver: begin
// secret is STILLTHERE_WEBHOOK_SECRET, as the receiver holds it.
var secret = []byte(os.Getenv("GUIDE_WEBHOOK_SECRET"))

func handleGuide(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil || !verifyGuide(r.Header.Get("X-Stillthere-Signature"), body, secret, time.Now()) {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	// Parse body; show the user the guide unless its id was shown, but
	// action "notify" (no text) is for your servers: the user went away,
	// show them nothing. Then 200.
}

// verifyGuide reports whether sig, the X-Stillthere-Signature header,
// signs body under secret and was made within 5 minutes of now.
func verifyGuide(sig string, body, secret []byte, now time.Time) bool {
	var ts string
	var macs []string
	for _, kv := range strings.Split(sig, ",") {
		switch k, v, _ := strings.Cut(kv, "="); k {
		case "t":
			ts = v
		case "v1":
			macs = append(macs, v)
		}
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(t, 0)).Abs() > 5*time.Minute {
		return false
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts + "."))
	m.Write(body)
	want := m.Sum(nil)
	for _, v := range macs {
		if got, err := hex.DecodeString(v); err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}

// README receiver: end

func TestREADMEReceiver(t *testing.T) {
	t.Run("README shows this code", func(t *testing.T) {
		readme, err := os.ReadFile("../../README.md")
		if err != nil {
			t.Fatal(err)
		}
		src, err := os.ReadFile("readme_test.go")
		if err != nil {
			t.Fatal(err)
		}
		_, code, _ := strings.Cut(string(src), "// README receiver: begin\n")
		code, _, _ = strings.Cut(code, "// README receiver: end\n")
		code = strings.TrimSpace(code)
		var shown []string
		for _, block := range strings.Split(string(readme), "```go\n")[1:] {
			block, _, _ = strings.Cut(block, "```")
			if strings.Contains(block, "func verifyGuide(") {
				shown = append(shown, strings.TrimSpace(block))
			}
		}
		if len(shown) != 1 || shown[0] != code {
			t.Fatalf("README.md shows %d blocks with verifyGuide; want one, the code of readme_test.go:\n%s", len(shown), code)
		}
	})

	body := []byte(`{"id":"0123456789abcdef0123456789abcdef","uid":"alice","segment":"default","text":"Hi?","deadline_ms":1}`)
	key := []byte("readme-webhook-secret-0123456789abcdef")
	other := []byte("other-webhook-secret-0123456789abcdef")
	now := time.Now()
	good := webhook.Sign(body, now, key)
	_, goodMAC, _ := strings.Cut(good, ",v1=")
	for _, tc := range []struct {
		name   string
		header string
		body   []byte
	}{
		{"good", good, body},
		{"signed 4 minutes ago", webhook.Sign(body, now.Add(-4*time.Minute), key), body},
		{"stale: signed 6 minutes ago", webhook.Sign(body, now.Add(-6*time.Minute), key), body},
		{"from 6 minutes ahead", webhook.Sign(body, now.Add(6*time.Minute), key), body},
		{"tampered body", good, bytes.Replace(body, []byte("alice"), []byte("mallory"), 1)},
		{"wrong secret", webhook.Sign(body, now, other), body},
		{"new and old secrets", webhook.Sign(body, now, other, key), body},
		{"unknown scheme beside v1", good + ",v2=x", body},
		{"empty", "", body},
		{"no t", "v1=" + goodMAC, body},
		{"no v1", "t=" + strconv.FormatInt(now.Unix(), 10), body},
		{"t not a number", "t=now,v1=" + goodMAC, body},
		{"v1 not hex", "t=" + strconv.FormatInt(now.Unix(), 10) + ",v1=zz", body},
		{"moved timestamp", "t=" + strconv.FormatInt(now.Unix()+1, 10) + ",v1=" + goodMAC, body},
		{"t past int64", "t=99999999999999999999,v1=" + goodMAC, body},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := webhook.Verify(tc.header, tc.body, now, key) == nil
			if got := verifyGuide(tc.header, tc.body, key, now); got != want {
				t.Errorf("verifyGuide = %v, Verify accepts: %v", got, want)
			}
		})
	}

	t.Run("handler", func(t *testing.T) {
		secret = key
		srv := httptest.NewServer(http.HandlerFunc(handleGuide))
		defer srv.Close()
		post := func(sig string) int {
			req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(webhook.HeaderSignature, sig)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if code := post(webhook.Sign(body, time.Now(), key)); code != http.StatusOK {
			t.Errorf("signed request: %d, want 200", code)
		}
		if code := post(webhook.Sign(body, time.Now().Add(-webhook.Tolerance-time.Minute), key)); code != http.StatusUnauthorized {
			t.Errorf("replayed request: %d, want 401", code)
		}
	})
}
