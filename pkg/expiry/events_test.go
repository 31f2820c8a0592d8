package expiry

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseKeyeventChannel(t *testing.T) {
	tests := []struct {
		name   string
		ch     string
		db     int
		event  string
		wantOK bool
	}{
		{name: "db 0", ch: "__keyevent@0__:expired", db: 0, event: "expired", wantOK: true},
		{name: "db 15", ch: "__keyevent@15__:expired", db: 15, event: "expired", wantOK: true},
		{name: "other event", ch: "__keyevent@3__:del", db: 3, event: "del", wantOK: true},
		{name: "leading zero", ch: "__keyevent@007__:expired", db: 7, event: "expired", wantOK: true},
		{name: "five digits", ch: "__keyevent@99999__:expired", db: 99999, event: "expired", wantOK: true},
		{name: "separator in event", ch: "__keyevent@1__:a__:b", db: 1, event: "a__:b", wantOK: true},

		{name: "empty", ch: ""},
		{name: "missing prefix", ch: "0__:expired"},
		{name: "keyspace channel", ch: "__keyspace@0__:expired"},
		{name: "prefix case", ch: "__KEYEVENT@0__:expired"},
		{name: "empty db", ch: "__keyevent@__:expired"},
		{name: "non-digit db", ch: "__keyevent@x__:expired"},
		{name: "digits then letters", ch: "__keyevent@1a__:expired"},
		{name: "plus sign", ch: "__keyevent@+1__:expired"},
		{name: "minus sign", ch: "__keyevent@-1__:expired"},
		{name: "space in db", ch: "__keyevent@ 1__:expired"},
		{name: "six digits", ch: "__keyevent@123456__:expired"},
		{name: "missing separator", ch: "__keyevent@0expired"},
		{name: "separator without colon", ch: "__keyevent@0__expired"},
		{name: "empty event", ch: "__keyevent@0__:"},
		{name: "prefix only", ch: "__keyevent@"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, event, ok := parseKeyeventChannel(tt.ch)
			if ok != tt.wantOK || db != tt.db || event != tt.event {
				t.Fatalf("parseKeyeventChannel(%q) = %d, %q, %v; want %d, %q, %v",
					tt.ch, db, event, ok, tt.db, tt.event, tt.wantOK)
			}
		})
	}
}

func FuzzParseKeyeventChannel(f *testing.F) {
	for _, s := range []string{
		"__keyevent@0__:expired",
		"__keyevent@15__:expired",
		"__keyevent@007__:del",
		"__keyevent@__:expired",
		"__keyevent@+1__:expired",
		"__keyevent@0__:",
		"__keyevent@123456__:expired",
		"__keyspace@0__:expired",
		"__keyevent@1__:a__:b",
		"",
	} {
		f.Add(s)
	}
	const prefix = "__keyevent@"
	f.Fuzz(func(t *testing.T, ch string) {
		db, event, ok := parseKeyeventChannel(ch)
		if !ok {
			if db != 0 || event != "" {
				t.Fatalf("parseKeyeventChannel(%q) rejected but returned %d, %q", ch, db, event)
			}
			return
		}
		// Accepted: ch is the prefix, 1-5 decimal digits naming db, the
		// separator, and a non-empty event.
		rest, found := strings.CutPrefix(ch, prefix)
		if !found {
			t.Fatalf("parseKeyeventChannel(%q) accepted a channel without the prefix", ch)
		}
		num, ev, found := strings.Cut(rest, "__:")
		if !found || ev != event || event == "" {
			t.Fatalf("parseKeyeventChannel(%q) = event %q, want the non-empty text after the first separator", ch, event)
		}
		if num == "" || len(num) > 5 || strings.Trim(num, "0123456789") != "" {
			t.Fatalf("parseKeyeventChannel(%q) accepted db %q", ch, num)
		}
		if n, err := strconv.Atoi(num); err != nil || n != db || db < 0 {
			t.Fatalf("parseKeyeventChannel(%q) = db %d, want %s", ch, db, num)
		}
		// The canonical form of what was parsed parses back the same.
		canon := prefix + strconv.Itoa(db) + "__:" + event
		if db2, event2, ok2 := parseKeyeventChannel(canon); !ok2 || db2 != db || event2 != event {
			t.Fatalf("round trip of %q via %q = %d, %q, %v", ch, canon, db2, event2, ok2)
		}
	})
}

func TestHasExpiredEvents(t *testing.T) {
	tests := []struct {
		flags string
		want  bool
	}{
		{"", false},
		{"E", false},
		{"x", false},
		{"Ex", true},
		{"xE", true},
		{"EA", true},
		{"AE", true},
		{"KEA", true},
		{"gxE", true},
		{"Kx", false}, // keyspace channels only, not keyevent
		{"KA", false},
		{"Ee", false}, // e is evicted, not expired
		{"EX", false}, // flags are case sensitive
		{"ex", false},
		{"Eg$lshzetd", false},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.flags), func(t *testing.T) {
			if got := hasExpiredEvents(tt.flags); got != tt.want {
				t.Fatalf("hasExpiredEvents(%q) = %v, want %v", tt.flags, got, tt.want)
			}
		})
	}
}

func TestMergeNotifyFlags(t *testing.T) {
	tests := []struct {
		flags, want string
	}{
		{"", "Ex"},
		{"E", "Ex"},
		{"x", "xE"},
		{"K", "KEx"},
		{"Kg$", "Kg$Ex"},
		{"KA", "KAE"},
		{"Ee", "Eex"},
		{"Ex", "Ex"},
		{"AE", "AE"},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.flags), func(t *testing.T) {
			got := mergeNotifyFlags(tt.flags)
			if got != tt.want {
				t.Fatalf("mergeNotifyFlags(%q) = %q, want %q", tt.flags, got, tt.want)
			}
			if !hasExpiredEvents(got) {
				t.Fatalf("mergeNotifyFlags(%q) = %q, which still lacks expired keyevents", tt.flags, got)
			}
			// Every flag already set is kept.
			for _, c := range tt.flags {
				if !strings.ContainsRune(got, c) {
					t.Fatalf("mergeNotifyFlags(%q) = %q dropped %q", tt.flags, got, c)
				}
			}
		})
	}
}
