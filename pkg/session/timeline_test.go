package session

import (
	"strings"
	"testing"
)

func FuzzParseTimelineEntry(f *testing.F) {
	for _, s := range []string{`1700000000000 {"kind":"lapse"}`, "12 x", "", " ", "-5 {}", "abc {}", "1700000000000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		e, err := ParseTimelineEntry(raw)
		if err != nil {
			return
		}
		if e.At.UnixMilli() <= 0 || !strings.HasSuffix(raw, " "+e.Entry) {
			t.Fatalf("ParseTimelineEntry(%q) = %+v", raw, e)
		}
	})
}
