package frame

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    Client
		invalid bool // not a JSON object: close 1007
		unknown bool // answered with unknown_type
		bad     bool // known type, bad fields
	}{
		{in: `{"type":"ping"}`, want: Client{Type: "ping"}},
		{in: ` {"type":"ping","extra":[1,2]} `, want: Client{Type: "ping"}},
		{in: `{"type":"ack","id":"abc"}`, want: Client{Type: "ack", ID: "abc"}},
		{in: `{"type":"ack"}`, want: Client{Type: "ack"}, bad: true},
		{in: `{"type":"ack","id":7}`, want: Client{Type: "ack"}, bad: true},
		{in: `{"type":"auth","token":"a.b.c"}`, want: Client{Type: "auth", Token: "a.b.c"}},
		{in: `{"type":"auth"}`, want: Client{Type: "auth"}, bad: true},
		{in: `{"type":"auth","token":""}`, want: Client{Type: "auth"}, bad: true},
		{in: `{"type":"auth","token":["a"]}`, want: Client{Type: "auth"}, bad: true},
		{in: `{"type":"auth","token":"` + strings.Repeat("a", MaxTokenLen+1) + `"}`, want: Client{Type: "auth", Token: strings.Repeat("a", MaxTokenLen+1)}, bad: true},
		{in: `{"type":"ping","token":"a.b.c"}`, want: Client{Type: "ping", Token: "a.b.c"}},
		{in: `{"type":"ping","active_ago_ms":0}`, want: Client{Type: "ping", HasActiveAgo: true}},
		{in: `{"type":"ping","active_ago_ms":1234}`, want: Client{Type: "ping", ActiveAgoMS: 1234, HasActiveAgo: true}},
		{in: `{"type":"ping","active_ago_ms":86400000}`, want: Client{Type: "ping", ActiveAgoMS: MaxActiveAgoMS, HasActiveAgo: true}},
		// Not a whole number of ms in range: ignored, the ping renews.
		{in: `{"type":"ping","active_ago_ms":86400001}`, want: Client{Type: "ping"}},
		{in: `{"type":"ping","active_ago_ms":-1}`, want: Client{Type: "ping"}},
		{in: `{"type":"ping","active_ago_ms":1.5}`, want: Client{Type: "ping"}},
		{in: `{"type":"ping","active_ago_ms":"12"}`, want: Client{Type: "ping"}},
		{in: `{"type":"ping","active_ago_ms":null}`, want: Client{Type: "ping"}},
		{in: `{"type":"ping","active_ago_ms":1e300}`, want: Client{Type: "ping"}},
		{in: `{"type":"hello"}`, want: Client{Type: "hello"}, unknown: true},
		{in: `{}`, unknown: true},
		{in: `{"type":1}`, unknown: true},
		{in: `not json`, invalid: true},
		{in: `{"type":"ping"`, invalid: true},
		{in: `[]`, invalid: true},
		{in: `"ping"`, invalid: true},
		{in: `null`, invalid: true},
		{in: ``, invalid: true},
		{in: "{\"type\":\"ping\"}\xff", invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.in[:min(len(tt.in), 40)], func(t *testing.T) {
			c, err := Parse([]byte(tt.in))
			if tt.invalid {
				if !errors.Is(err, ErrInvalidJSON) {
					t.Fatalf("Parse = %+v, %v; want ErrInvalidJSON", c, err)
				}
				return
			}
			if err != nil || c != tt.want {
				t.Fatalf("Parse = %+v, %v; want %+v", c, err, tt.want)
			}
			verr := c.Validate()
			if IsUnknownType(verr) != tt.unknown || (verr != nil && !tt.unknown) != tt.bad {
				t.Fatalf("Validate = %v; want unknown %v bad %v", verr, tt.unknown, tt.bad)
			}
		})
	}
}

func TestServerFrames(t *testing.T) {
	for _, b := range [][]byte{Pong(61234, 0), Guide("id1", "Are you still there?", 1795255600123, 1, false), Error(CodeUnknownType, ""), AuthOK(1795255600123)} {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || m["type"] == nil {
			t.Fatalf("%s: %v", b, err)
		}
	}
	if got := string(Pong(61234, 0)); got != `{"type":"pong","ttl_ms":61234}` {
		t.Fatalf("Pong = %s", got)
	}
	if got := string(Pong(61234, 1795255600123)); got != `{"type":"pong","ttl_ms":61234,"deadline_ms":1795255600123}` {
		t.Fatalf("Pong with its deadline = %s", got)
	}
	if got := string(Guide("id1", "Still there?", 1795255600123, 1, false)); got != `{"type":"guide","id":"id1","text":"Still there?","deadline_ms":1795255600123,"stage":1,"final":false}` {
		t.Fatalf("Guide = %s", got)
	}
	if got := string(AuthOK(1795255600123)); got != `{"type":"auth_ok","expires_ms":1795255600123}` {
		t.Fatalf("AuthOK = %s", got)
	}
	if got := string(Guide("id1", "We closed this chat.", 1795255600123, 2, true)); got != `{"type":"guide","id":"id1","text":"We closed this chat.","deadline_ms":1795255600123,"stage":2,"final":true}` {
		t.Fatalf("Guide of a close stage = %s", got)
	}
	if got := string(Guide("id1", "Still there?", 0, 0, false)); got != `{"type":"guide","id":"id1","text":"Still there?","stage":1,"final":false}` {
		t.Fatalf("Guide without a deadline = %s", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"type":"ping"}`, `{"type":"ack","id":"x"}`, `[]`, `{"type":{}}`,
		`{"type":"auth","token":"eyJhbGciOiJIUzI1NiJ9.e30.sig"}`, `{"type":"auth","token":null}`, `{"type":"auth","token":"\u0000"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if sc, serr := parse(b); sc != c || !errors.Is(err, serr) && err != serr {
			t.Fatalf("Parse(%q) = %+v, %v; its general path says %+v, %v", b, c, err, sc, serr)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
		err = c.Validate()
		if err == nil && c.Type != TypePing && c.Type != TypeAck && c.Type != TypeAuth {
			t.Fatalf("validated unknown type %q", c.Type)
		}
		if err == nil && c.Type == TypeAuth && (c.Token == "" || len(c.Token) > MaxTokenLen) {
			t.Fatalf("validated an auth frame with a %d-byte token", len(c.Token))
		}
	})
}

func BenchmarkParsePing(b *testing.B) {
	in := []byte(`{"type":"ping"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(in); err != nil {
			b.Fatal(err)
		}
	}
}

// The plain ping's fast path answers what the general path does.
func TestParsePlainPing(t *testing.T) {
	fast, err := Parse([]byte(`{"type":"ping"}`))
	slow, serr := parse([]byte(`{"type":"ping"}`))
	if err != nil || serr != nil || fast != slow || fast.Type != TypePing {
		t.Fatalf("fast %+v, %v; general %+v, %v", fast, err, slow, serr)
	}
}

// Pong writes the bytes encoding/json writes for its fields.
func TestPongAsJSON(t *testing.T) {
	for _, c := range [][2]int64{{0, 0}, {30000, 0}, {30000, 1_800_000_000_123}, {-1, -5}, {math.MaxInt64, math.MinInt64}, {1, 1}} {
		want := pongJSON(c[0], c[1])
		if got := Pong(c[0], c[1]); string(got) != string(want) {
			t.Errorf("Pong(%d, %d) = %s, want %s", c[0], c[1], got, want)
		}
	}
}

// pongJSON is what encoding/json writes for a pong's fields.
func pongJSON(ttlMS, deadlineMS int64) []byte {
	b, err := json.Marshal(struct {
		Type       string `json:"type"`
		TTLMS      int64  `json:"ttl_ms"`
		DeadlineMS int64  `json:"deadline_ms,omitempty"`
	}{TypePong, ttlMS, deadlineMS})
	if err != nil {
		panic(err)
	}
	return b
}

func FuzzPong(f *testing.F) {
	f.Add(int64(30000), int64(1_800_000_000_123))
	f.Add(int64(0), int64(0))
	f.Fuzz(func(t *testing.T, ttl, deadline int64) {
		want := pongJSON(ttl, deadline)
		if got := Pong(ttl, deadline); string(got) != string(want) {
			t.Fatalf("Pong(%d, %d) = %s, want %s", ttl, deadline, got, want)
		}
	})
}

func BenchmarkPong(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		Pong(30000, 1_800_000_000_123)
	}
}
