package timeoutevent

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	d := time.UnixMilli(1_763_720_000_123)
	e := New("alice", "vip", d, d.Add(80*time.Millisecond), SourceSweep)
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if got != e {
		t.Fatalf("round trip: got %+v, want %+v", got, e)
	}
	if got.Deadline() != d {
		t.Fatalf("Deadline() = %v, want %v", got.Deadline(), d)
	}
}

func TestIDStableAcrossSources(t *testing.T) {
	d := time.UnixMilli(1_763_720_000_000)
	a := New("u", "default", d, d.Add(time.Millisecond), SourceSweep)
	b := New("u", "default", d, d.Add(time.Minute), SourceEvent)
	if a.ID != b.ID {
		t.Fatal("same silence, different ids")
	}
	if c := New("u", "default", d.Add(time.Millisecond), d, SourceSweep); c.ID == a.ID {
		t.Fatal("different deadlines, same id")
	}
	if c := New("v", "default", d, d, SourceSweep); c.ID == a.ID {
		t.Fatal("different users, same id")
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		version bool
	}{
		{"not json", `{`, false},
		{"no version", `{"id":"x","uid":"u","deadline_ms":1}`, false},
		{"future version", `{"v":2,"id":"x"}`, true},
		{"no uid", `{"v":1,"id":"x","deadline_ms":1}`, false},
		{"no deadline", `{"v":1,"id":"x","uid":"u"}`, false},
		{"forged id", `{"v":1,"id":"00","uid":"u","deadline_ms":1}`, false},
		{"string version", `{"v":"1"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.in))
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			if got := errors.Is(err, ErrUnknownVersion); got != tt.version {
				t.Fatalf("errors.Is(ErrUnknownVersion) = %v, want %v (%v)", got, tt.version, err)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	e := New("alice", "vip", time.UnixMilli(1e12), time.UnixMilli(1e12+5), SourceEvent)
	b, _ := e.Marshal()
	f.Add(b)
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte(`{"v":1,"uid":"","deadline_ms":-1}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := Parse(in)
		if err != nil {
			return
		}
		// A parsed event re-encodes to something that parses to itself.
		out, err := e.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(out)
		if err != nil || again != e {
			t.Fatalf("re-parse of %s: %+v, %v", bytes.TrimSpace(out), again, err)
		}
	})
}
