package webhook

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

var (
	testBody   = []byte(`{"id":"0123456789abcdef0123456789abcdef","uid":"alice","segment":"default","text":"Are you still there?","deadline_ms":1795255600123}`)
	oldSecret  = []byte("old-webhook-secret-0123456789abcdef")
	newSecret  = []byte("new-webhook-secret-0123456789abcdef")
	testSigned = time.Unix(1795255601, 0)
)

func TestVerify(t *testing.T) {
	v1 := func(h string) string { _, v, _ := strings.Cut(h, ",v1="); return v }
	good := Sign(testBody, testSigned, oldSecret)
	tests := []struct {
		name    string
		header  string
		body    []byte
		now     time.Time
		secrets [][]byte
		wantErr string // empty: verifies
	}{
		{name: "good", header: good},
		{name: "good at the edge of the tolerance", header: good, now: testSigned.Add(Tolerance)},
		{name: "good from a clock ahead of ours", header: good, now: testSigned.Add(-Tolerance)},
		{name: "stale: a replay after the tolerance", header: good, now: testSigned.Add(Tolerance + time.Second), wantErr: "t: signed 5m1s ago, more than the 5m0s tolerance"},
		{name: "future beyond the tolerance", header: good, now: testSigned.Add(-Tolerance - time.Second), wantErr: "t: signed 5m1s ahead of this clock"},
		{name: "tampered body", header: good, body: []byte(strings.Replace(string(testBody), "alice", "mallory", 1)), wantErr: "no v1 matches"},
		{name: "wrong secret", header: good, secrets: [][]byte{newSecret}, wantErr: "no v1 matches"},
		{name: "timestamp moved", header: "t=1795255602,v1=" + v1(good), wantErr: "no v1 matches"},
		{name: "receiver holding old and new secrets", header: good, secrets: [][]byte{newSecret, oldSecret}},
		{name: "header signed with new and old secrets", header: Sign(testBody, testSigned, newSecret, oldSecret)},
		{name: "an unknown scheme beside v1 is skipped", header: good + ",v2=whatever"},
		{name: "no secret", header: good, secrets: [][]byte{}, wantErr: "no secret given"},
		{name: "empty secret", header: good, secrets: [][]byte{oldSecret, nil}, wantErr: "secret 1 is empty"},

		{name: "empty header", header: "", wantErr: HeaderSignature + ": empty"},
		{name: "the untimed sha256= form", header: "sha256=" + v1(good), wantErr: "no t"},
		{name: "no v1", header: "t=1795255601", wantErr: "no v1"},
		{name: "no t", header: "v1=" + v1(good), wantErr: "no t"},
		{name: "t twice", header: "t=1795255601,t=1795255601,v1=" + v1(good), wantErr: "t: given twice"},
		{name: "t not a number", header: "t=soon,v1=" + v1(good), wantErr: `t: "soon": want Unix seconds`},
		{name: "t with a sign", header: "t=+1795255601,v1=" + v1(good), wantErr: `t: "+1795255601"`},
		{name: "t negative", header: "t=-1,v1=" + v1(good), wantErr: `t: "-1"`},
		{name: "t with a leading zero", header: "t=01795255601,v1=" + v1(good), wantErr: `t: "01795255601"`},
		{name: "t zero", header: "t=0,v1=" + v1(good), wantErr: `t: "0"`},
		{name: "t empty", header: "t=,v1=" + v1(good), wantErr: `t: ""`},
		{name: "t past int64", header: "t=99999999999999999999,v1=" + v1(good), wantErr: `t: "99999999999999999999"`},
		{name: "t in milliseconds", header: Sign(testBody, time.Unix(testSigned.UnixMilli(), 0), oldSecret), wantErr: "ahead of this clock"},
		{name: "v1 short", header: "t=1795255601,v1=abcd", wantErr: `v1: "abcd": want 64 hex digits`},
		{name: "v1 not hex", header: "t=1795255601,v1=" + strings.Repeat("zz", 32), wantErr: "want 64 hex digits"},
		{name: "v1 empty", header: "t=1795255601,v1=", wantErr: `v1: "": want 64 hex digits`},
		{name: "too many v1", header: "t=1795255601" + strings.Repeat(",v1="+v1(good), 5), wantErr: "v1: more than 4"},
		{name: "spaces", header: "t=1795255601, v1=" + v1(good), wantErr: `element " v1=`},
		{name: "trailing comma", header: good + ",", wantErr: `element ""`},
		{name: "element without =", header: "t=1795255601,v1", wantErr: `element "v1"`},
		{name: "upper-case key", header: "T=1795255601,v1=" + v1(good), wantErr: `element "T=1795255601"`},
		{name: "too long", header: good + strings.Repeat(",x=y", 300), wantErr: "bytes, want at most 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, now, secrets := tt.body, tt.now, tt.secrets
			if body == nil {
				body = testBody
			}
			if now.IsZero() {
				now = testSigned
			}
			if secrets == nil {
				secrets = [][]byte{oldSecret}
			}
			err := Verify(tt.header, body, now, secrets...)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Verify = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Verify = %v, want an error containing %q", err, tt.wantErr)
			}
			if err != nil {
				for _, k := range secrets {
					if len(k) > 0 && strings.Contains(err.Error(), string(k)) {
						t.Errorf("error %q holds a secret", err)
					}
				}
			}
		})
	}
}

// TestSignFormat pins the wire form: the timestamp, then one v1 per
// secret, in order, over "<t>.<body>".
func TestSignFormat(t *testing.T) {
	h := Sign([]byte("{}"), time.Unix(1700000000, 999_000_000), []byte("k1"), []byte("k2"))
	// printf '1700000000.{}' | openssl dgst -sha256 -hmac k1 (and k2)
	want := "t=1700000000" +
		",v1=785007fcdfc0a1ff84024b971255b4ed6d6252a8ab40f7c5a4ea4f4da336a83b" +
		",v1=19aa0643fc69758f973f49d7028570bd88d45268d61a54cc708b745d0ab9aac5"
	if h != want {
		t.Fatalf("Sign = %q, want %q", h, want)
	}
	s, err := ParseSignature(h)
	if err != nil {
		t.Fatal(err)
	}
	if s.Timestamp != 1700000000 || len(s.V1) != 2 {
		t.Fatalf("parsed %+v, want t=1700000000 and two v1", s)
	}
	if s.V1[0] != mac([]byte("k1"), 1700000000, []byte("{}")) || s.V1[1] != mac([]byte("k2"), 1700000000, []byte("{}")) {
		t.Error("v1 values are not the MACs of the secrets in order")
	}
	if got := s.String(); got != h {
		t.Errorf("String = %q, want %q", got, h)
	}
}

func FuzzParseSignature(f *testing.F) {
	good := Sign(testBody, testSigned, oldSecret)
	for _, seed := range []string{
		good,
		Sign(testBody, testSigned, newSecret, oldSecret),
		good + ",v2=future",
		"",
		"t=",
		"t=1,v1=",
		"sha256=" + strings.Repeat("ab", 32),
		"t=+1,v1=" + strings.Repeat("ab", 32),
		"t=1795255601,,v1=" + strings.Repeat("AB", 32),
		"=,=,=",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		s, err := ParseSignature(header)
		// Verify reads any header without panicking, and accepts only
		// what parses.
		if verr := Verify(header, testBody, testSigned, oldSecret); verr == nil && err != nil {
			t.Fatalf("Verify accepted %q, which does not parse: %v", header, err)
		}
		if err != nil {
			return
		}
		if s.Timestamp <= 0 || len(s.V1) == 0 || len(s.V1) > maxV1 {
			t.Fatalf("ParseSignature(%q) = %+v, outside the bounds", header, s)
		}
		again, err := ParseSignature(s.String())
		if err != nil || !reflect.DeepEqual(again, s) {
			t.Fatalf("ParseSignature(%q) = %+v, whose String %q parses to %+v, %v", header, s, s.String(), again, err)
		}
	})
}
