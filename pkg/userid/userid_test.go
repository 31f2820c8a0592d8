package userid

import (
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
