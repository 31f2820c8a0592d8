package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver"
)

// TestShortRun runs the suite for half a minute on a few cheap kinds of
// fault, and fails on any stage that broke the promise. It builds the
// three services first. About a minute and a half: the run settles past
// its last minute window.
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("the stack as processes for a minute and more")
	}
	// It finds promise failures the product still has (a gateway frozen
	// for less than its heartbeat lease; a pong and a guide that name
	// different deadlines after a Redis pause: bench/nemesis.md), so it
	// is not in make test's run until they are fixed.
	if os.Getenv("STILLTHERE_NEMESIS_E2E") == "" {
		t.Skip("set STILLTHERE_NEMESIS_E2E=1 to run the short fault schedule (it fails on the product's open promise failures)")
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
	ks, err := kindsNamed("sigkill gateway,redis pause,kafka refuse produce,push duplicate,cut user-gateway")
	if err != nil {
		t.Fatal(err)
	}
	s := settings{bin: bin, seed: 7, duration: 30 * time.Second, users: 30, ttl: 4 * time.Second,
		closeAfter: 3 * time.Second, grace: 5 * time.Second, kinds: ks}
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
	out := t.TempDir() + "/nemesis.md"
	os.WriteFile(out, []byte(md), 0o644)
	if res.signals == 0 || res.guides == 0 || len(res.outcomes) == 0 {
		t.Fatalf("an empty run: %d signals, %d guides, %d faults", res.signals, res.guides, len(res.outcomes))
	}
	for _, o := range res.outcomes {
		if o.Err != nil {
			t.Errorf("fault %s: %v", o.Kind, o.Err)
		}
	}
	if fails := res.failures(); len(fails) > 0 {
		t.Errorf("seed %d: %d stages broke the promise:\n%s", s.seed, len(fails), section(md, "## Failures"))
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
