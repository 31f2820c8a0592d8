package session

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stillthere/stillthere/pkg/userid"
)

func TestParseSessionKey(t *testing.T) {
	ks, err := NewKeyspace("st")
	if err != nil {
		t.Fatal(err)
	}
	good := []string{"u1", "alice@example.com", "a.b:c-d_e", strings.Repeat("x", 128)}
	for _, uid := range good {
		got, err := ks.ParseSessionKey(ks.SessionKey(uid))
		if err != nil || got != uid {
			t.Errorf("ParseSessionKey(SessionKey(%q)) = %q, %v", uid, got, err)
		}
	}
	b := Bucket("u1")
	bad := map[string]string{
		"other prefix":   "xx:{b" + itoa(b) + "}:s:u1",
		"wrong bucket":   "st:{b" + itoa((b+1)%Buckets) + "}:s:u1",
		"leading zero":   "st:{b0" + itoa(b) + "}:s:u1",
		"signed bucket":  "st:{b+" + itoa(b) + "}:s:u1",
		"bucket too big": "st:{b64}:s:u1",
		"index key":      ks.IndexKey(b),
		"empty uid":      "st:{b" + itoa(b) + "}:s:",
		"bad uid char":   "st:{b" + itoa(Bucket("u 1")) + "}:s:u 1",
		"uid too long":   ks.SessionKeyPrefix(Bucket(strings.Repeat("x", 129))) + strings.Repeat("x", 129),
		"empty":          "",
		"dedup key":      ks.DedupKey("u1", 5),
	}
	for name, key := range bad {
		if uid, err := ks.ParseSessionKey(key); err == nil {
			t.Errorf("%s: ParseSessionKey(%q) = %q, want error", name, key, uid)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestNewKeyspaceRejects(t *testing.T) {
	for _, p := range []string{"", "a{b}", "a:b", strings.Repeat("p", 33), "a b"} {
		if _, err := NewKeyspace(p); err == nil {
			t.Errorf("NewKeyspace(%q) succeeded", p)
		}
	}
}

func FuzzParseSessionKey(f *testing.F) {
	ks, _ := NewKeyspace("st")
	f.Add(ks.SessionKey("u1"))
	f.Add(ks.IndexKey(3))
	f.Add("st:{b}:s:x")
	f.Add("st:{b99}:s:")
	f.Fuzz(func(t *testing.T, key string) {
		uid, err := ks.ParseSessionKey(key)
		if err != nil {
			return
		}
		// Whatever parses must round-trip to the very same key.
		if ks.SessionKey(uid) != key {
			t.Fatalf("ParseSessionKey(%q) = %q, whose key is %q", key, uid, ks.SessionKey(uid))
		}
		if !userid.Valid(uid) {
			t.Fatalf("parsed invalid uid %q", uid)
		}
	})
}
