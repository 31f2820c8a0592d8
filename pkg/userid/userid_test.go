package userid

import (
	"regexp"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		uid  string
		want bool
	}{
		{"alice", true},
		{"user@example.com", true},
		{"a:b.c_d-e", true},
		{strings.Repeat("u", 128), true},
		{"", false},
		{strings.Repeat("u", 129), false},
		{"a/b", false},
		{"a{b}", false},
		{"a b", false},
	} {
		if got := Valid(tc.uid); got != tc.want {
			t.Errorf("Valid(%q) = %v, want %v", tc.uid, got, tc.want)
		}
	}
}

func TestValidSegment(t *testing.T) {
	for _, tc := range []struct {
		seg  string
		want bool
	}{
		{DefaultSegment, true},
		{"vip.eu-1", true},
		{strings.Repeat("s", 64), true},
		{"", false},
		{strings.Repeat("s", 65), false},
		{"a:b", false},
		{"a@b", false},
	} {
		if got := ValidSegment(tc.seg); got != tc.want {
			t.Errorf("ValidSegment(%q) = %v, want %v", tc.seg, got, tc.want)
		}
	}
}

// The rules as the regexps they were written as: Valid and ValidSegment
// must say what these say.
var (
	uidRE     = regexp.MustCompile(`^[A-Za-z0-9._:@-]{1,128}$`)
	segmentRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// FuzzValid: Valid and ValidSegment agree with the regexps, on any input.
func FuzzValid(f *testing.F) {
	for _, s := range []string{"", "alice", "a:b@c", "vip.eu-1", "a b", "é", "a\x00", "a\n", strings.Repeat("u", 64), strings.Repeat("u", 65),
		strings.Repeat("u", 128), strings.Repeat("u", 129), "ü" + strings.Repeat("u", 127), "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := Valid(s), uidRE.MatchString(s); got != want {
			t.Errorf("Valid(%q) = %v, the regexp says %v", s, got, want)
		}
		if got, want := ValidSegment(s), segmentRE.MatchString(s); got != want {
			t.Errorf("ValidSegment(%q) = %v, the regexp says %v", s, got, want)
		}
	})
}
