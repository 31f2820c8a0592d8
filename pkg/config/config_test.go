package config

import (
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestBinder(t *testing.T) {
	env := map[string]string{
		"STILLTHERE_SESSION_TTL": "30s",
		"STILLTHERE_ADDRS":       "a:1, b:2,,",
		"STILLTHERE_NAME":        "from-env",
		"STILLTHERE_N":           "7",
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	b := NewBinder(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	var ttl time.Duration
	var addrs []string
	var name string
	var n int
	var on bool
	b.Duration(&ttl, "session-ttl", time.Minute, "")
	b.List(&addrs, "addrs", "", "")
	b.String(&name, "name", "def", "")
	b.Int(&n, "n", 1, "")
	b.Bool(&on, "on", true, "")
	if err := b.Parse([]string{"-name", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if ttl != 30*time.Second || !reflect.DeepEqual(addrs, []string{"a:1", "b:2"}) || name != "from-flag" || n != 7 || !on {
		t.Fatalf("got ttl %v addrs %q name %q n %d on %v", ttl, addrs, name, n, on)
	}
}

func TestBinderNamesBadEnv(t *testing.T) {
	env := map[string]string{"STILLTHERE_SESSION_TTL": "60", "STILLTHERE_N": "x"}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	b := NewBinder(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	var ttl time.Duration
	var n int
	b.Duration(&ttl, "session-ttl", time.Minute, "")
	b.Int(&n, "n", 1, "")
	err := b.Parse(nil)
	if err == nil || !strings.Contains(err.Error(), `STILLTHERE_SESSION_TTL="60"`) || !strings.Contains(err.Error(), "STILLTHERE_N") {
		t.Fatalf("Parse = %v, want errors naming both variables", err)
	}
}
