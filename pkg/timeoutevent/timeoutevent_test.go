package timeoutevent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

func TestStages(t *testing.T) {
	d := time.UnixMilli(1_763_720_000_123)
	first := New("alice", "vip", d, d, SourceSweep)
	// Stage 1's id is the id of events before stages: a consumer that
	// dedupes by it sees no change across the upgrade.
	if first.ID != "39a1182abddf6ed9cf9e569d908c7b37" || first.Stage != 1 || first.Action != ActionRemind || first.Final || first.DueMS != d.UnixMilli() {
		t.Fatalf("stage 1: %+v", first)
	}
	closing := first.AtStage(2, d.Add(3*time.Minute), ActionClose, "We closed this chat.", true)
	if closing.ID == first.ID || closing.ID != StageID("alice", d.UnixMilli(), 2) || !closing.Final || closing.DeadlineMS != first.DeadlineMS {
		t.Fatalf("stage 2: %+v", closing)
	}
	if again := first.AtStage(1, d, ActionRemind, "", false); again.ID != first.ID {
		t.Fatal("AtStage(1) changed the id")
	}
	b, _ := closing.Marshal()
	got, err := Parse(b)
	if err != nil || got != closing {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, closing)
	}
	// The last stage carries its reason, whatever its action; only a
	// close stage is final (the chat ends).
	for _, tt := range []struct {
		action string
		last   bool
		reason string
	}{
		{ActionRemind, false, ""},
		{ActionRemind, true, ReasonInactive},
		{ActionNotify, false, ""},
		{ActionNotify, true, ReasonNotify},
		{ActionClose, true, ReasonEnded},
		{ActionClose, false, ReasonEnded}, // a close stage is always the last
	} {
		text := "text"
		if tt.action == ActionNotify {
			text = ""
		}
		e := first.AtStage(2, d.Add(time.Minute), tt.action, text, tt.last)
		if e.Final != (tt.action == ActionClose) || e.Reason != tt.reason || e.Last() != (tt.reason != "") {
			t.Errorf("%s, last %v: final %v reason %q, want reason %q", tt.action, tt.last, e.Final, e.Reason, tt.reason)
		}
		b, _ := e.Marshal()
		if got, err := Parse(b); err != nil || got != e {
			t.Errorf("%s, last %v: round trip %+v, %v", tt.action, tt.last, got, err)
		}
	}
	// A close stage's event from before reasons reads with its reason.
	closeBefore := `{"v":1,"id":"` + StageID("alice", d.UnixMilli(), 2) + `","uid":"alice","deadline_ms":1763720000123,"stage":2,"due_ms":1763720180123,"action":"close","final":true,"text":"Closed."}`
	if got, err := Parse([]byte(closeBefore)); err != nil || got.Reason != ReasonEnded {
		t.Fatalf("close event before reasons: %+v, %v", got, err)
	}
	// An event of a listener before stages reads as stage 1's reminder.
	old := `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","segment":"vip","deadline_ms":1763720000123,"detected_ms":1763720000200,"source":"sweep"}`
	got, err = Parse([]byte(old))
	if err != nil || got.Stage != 1 || got.Action != ActionRemind || got.Final || got.DueMS != d.UnixMilli() {
		t.Fatalf("event before stages: %+v, %v", got, err)
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
		{"future version", `{"v":3,"id":"x"}`, true},
		{"notify stage as v1", `{"v":1,"id":"5148c52370d968954e002f42270bc924","uid":"gone","deadline_ms":1795255600123,"stage":2,"due_ms":1795255720123,"action":"notify"}`, false},
		{"reminder as v2", `{"v":2,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"stage":1,"due_ms":1763720000123,"action":"remind"}`, false},
		{"no uid", `{"v":1,"id":"x","deadline_ms":1}`, false},
		{"no deadline", `{"v":1,"id":"x","uid":"u"}`, false},
		{"forged id", `{"v":1,"id":"00","uid":"u","deadline_ms":1}`, false},
		{"string version", `{"v":"1"}`, false},
		{"stage 0 with an action", `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"action":"remind"}`, false},
		{"stage too high", `{"v":1,"id":"x","uid":"alice","deadline_ms":1763720000123,"stage":11,"due_ms":1763720000123,"action":"remind"}`, false},
		{"unknown action", `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"stage":1,"due_ms":1763720000123,"action":"nag"}`, false},
		{"final reminder", `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"stage":1,"due_ms":1763720000123,"action":"remind","final":true,"reason":"inactive"}`, false},
		{"last reminder with another's reason", `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"stage":1,"due_ms":1763720000123,"action":"remind","reason":"ended"}`, false},
		{"close with notify's reason", `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"stage":1,"due_ms":1763720000123,"action":"close","final":true,"reason":"notify"}`, false},
		{"unknown reason", `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"stage":1,"due_ms":1763720000123,"action":"notify","reason":"gone"}`, false},
		{"notify with a text", `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"stage":1,"due_ms":1763720000123,"action":"notify","text":"hi"}`, false},
		{"close not final", `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"stage":1,"due_ms":1763720000123,"action":"close"}`, false},
		{"due before deadline", `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"stage":1,"due_ms":5,"action":"remind"}`, false},
		{"stage 1 id on stage 2", `{"v":1,"id":"39a1182abddf6ed9cf9e569d908c7b37","uid":"alice","deadline_ms":1763720000123,"stage":2,"due_ms":1763720000123,"action":"remind"}`, false},
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
	f.Add([]byte(`{"v":3}`))
	f.Add([]byte(`{"v":1,"uid":"","deadline_ms":-1}`))
	c := e.AtStage(3, time.UnixMilli(1e12+60_000), ActionClose, "closed", true)
	b, _ = c.Marshal()
	f.Add(b)
	n := e.AtStage(2, time.UnixMilli(1e12+30_000), ActionNotify, "", true)
	b, _ = n.Marshal()
	f.Add(b)
	f.Add([]byte(`{"v":9,"uid":7}`))
	f.Add([]byte(`{"uid":7}`))
	f.Add([]byte(`{"v":1,"uid":7}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := Parse(in)
		// Parse decodes once; its verdict is the one of decoding the
		// version first, then the event, as it did before.
		if we, werr := parseVersionFirst(in); (err == nil) != (werr == nil) || e != we ||
			errors.Is(err, ErrUnknownVersion) != errors.Is(werr, ErrUnknownVersion) {
			t.Fatalf("Parse(%q) = %+v, %v; decoding the version first: %+v, %v", in, e, err, we, werr)
		}
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

// BenchmarkParse: the guide consumer parses every record it takes.
func BenchmarkParse(b *testing.B) {
	e := New("user-0001234", "vip", time.UnixMilli(1e12), time.UnixMilli(1e12+5), SourceSweep)
	in, _ := e.Marshal()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(in); err != nil {
			b.Fatal(err)
		}
	}
}

// parseVersionFirst is Parse as it was: the version decoded alone first,
// then the whole event, each check after as Parse makes them.
func parseVersionFirst(b []byte) (Event, error) {
	var head struct {
		Version *int `json:"v"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return Event{}, err
	}
	if head.Version == nil {
		return Event{}, errNoVersion
	}
	if *head.Version != Version && *head.Version != VersionNotify {
		return Event{}, fmt.Errorf("%w: %d", ErrUnknownVersion, *head.Version)
	}
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return Event{}, err
	}
	return complete(e)
}

// BenchmarkMarshal: the listener encodes every event it produces.
func BenchmarkMarshal(b *testing.B) {
	d := time.UnixMilli(1e12)
	e := New("user-0001234", "vip", d, d.Add(5*time.Millisecond), SourceSweep).AtStage(2, d.Add(time.Minute), ActionRemind, "Are you still there?", false)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Marshal(); err != nil {
			b.Fatal(err)
		}
	}
}

// stageIDStream is StageID as it was first written, hashing as it goes:
// ids are in every topic and every idempotency key, so the new one must
// give the same.
func stageIDStream(uid string, deadlineMS int64, stage int) string {
	h := sha256.New()
	h.Write([]byte("stillthere/timeout/v1\x00"))
	h.Write([]byte(uid))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatInt(deadlineMS, 10)))
	if stage > 1 {
		h.Write([]byte("\x00stage\x00"))
		h.Write([]byte(strconv.Itoa(stage)))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

func FuzzStageID(f *testing.F) {
	f.Add("alice", int64(1763720000123), 1)
	f.Add("alice", int64(1763720000123), 2)
	f.Add(strings.Repeat("u", 200), int64(-1), 10)
	f.Add("", int64(0), 0)
	f.Fuzz(func(t *testing.T, uid string, deadlineMS int64, stage int) {
		if got, want := StageID(uid, deadlineMS, stage), stageIDStream(uid, deadlineMS, stage); got != want {
			t.Fatalf("StageID(%q, %d, %d) = %s, want %s", uid, deadlineMS, stage, got, want)
		}
	})
}

// TestStageIDKnown: ids as the first release wrote them. A change here
// renames every silence's events and idempotency keys.
func TestStageIDKnown(t *testing.T) {
	for _, tc := range []struct {
		stage int
		want  string
	}{{1, "39a1182abddf6ed9cf9e569d908c7b37"}, {3, "dbdeab93511cd0dab549c87379743f77"}} {
		if got := StageID("alice", 1763720000123, tc.stage); got != tc.want {
			t.Errorf("StageID(alice, 1763720000123, %d) = %s, want %s", tc.stage, got, tc.want)
		}
	}
}
