package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver"
)

// TestShortRun is the fault-schedule suite as CI runs it: the three
// services as processes for half a minute of faults each, on a fixed
// seed (a few cheap kinds) and then on a random seed (every kind), and
// it fails on any stage that broke the promise (lost, false, duplicated,
// disordered, spam), naming the seed to replay. It builds the three
// services first. About two minutes a run: each settles past its last
// minute window. make nemesis runs the same suite long.
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("the stack as processes for minutes")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip(redisserver.ErrNotInstalled)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "./gateway", "./expiry-listener", "./guide-consumer")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the services: %v\n%s", err, out)
	}
	cheap, err := kindsNamed("sigkill gateway,redis pause,kafka refuse produce,push duplicate,cut user-gateway")
	if err != nil {
		t.Fatal(err)
	}
	random, err := parseSeed("random")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		name  string
		seed  uint64
		kinds []kind
	}{
		{"fixed", 7, cheap},
		{"random", random, kinds},
	} {
		t.Run(r.name, func(t *testing.T) {
			s := settings{bin: bin, seed: r.seed, duration: 30 * time.Second, users: 30, ttl: 4 * time.Second,
				closeAfter: 3 * time.Second, grace: outageGrace(4 * time.Second), kinds: r.kinds}
			shortRun(t, s)
		})
	}
}

// shortRun runs s and fails on any stage that broke the promise, or a
// fault that could not be caused.
func shortRun(t *testing.T, s settings) {
	names := make([]string, len(s.kinds))
	for i, k := range s.kinds {
		names[i] = k.name
	}
	replay := fmt.Sprintf("go build -o bin/ ./gateway ./expiry-listener ./guide-consumer ./loadtest/nemesis && "+
		"bin/nemesis -bin bin -seed %d -duration %v -users %d -ttl %v -close-after %v -grace %v -coverage=false -faults %q",
		s.seed, s.duration, s.users, s.ttl, s.closeAfter, s.grace, strings.Join(names, ","))
	t.Logf("seed %d; replay: %s", s.seed, replay)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := run(ctx, s)
	if errors.Is(err, redisserver.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	md := res.markdown()
	if res.signals == 0 || res.guides == 0 || len(res.outcomes) == 0 {
		t.Fatalf("an empty run: %d signals, %d guides, %d faults", res.signals, res.guides, len(res.outcomes))
	}
	for _, o := range res.outcomes {
		if o.Err != nil {
			t.Errorf("fault %s: %v", o.Kind, o.Err)
		}
	}
	if fails := res.failures(); len(fails) > 0 {
		t.Errorf("seed %d: %d stages broke the promise (replay: %s):\n%s\n%s", s.seed, len(fails), replay,
			section(md, "## Failures"), section(md, "## The schedule"))
	}
	t.Logf("the promise, by fault kind:\n%s", section(md, "## The promise"))
}

// section is md's section that begins with heading.
func section(md, heading string) string {
	i := strings.Index(md, heading)
	if i < 0 {
		return ""
	}
	rest := md[i+len(heading):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}
