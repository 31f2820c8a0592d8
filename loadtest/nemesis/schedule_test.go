package main

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestScheduleReplaysFromItsSeed(t *testing.T) {
	a := schedule(42, 3*time.Minute, kinds)
	b := schedule(42, 3*time.Minute, kinds)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 42 gave two schedules:\n%v\n%v", a, b)
	}
	if c := schedule(43, 3*time.Minute, kinds); reflect.DeepEqual(a, c) {
		t.Fatalf("seeds 42 and 43 gave the same schedule:\n%v", a)
	}
}

func TestScheduleShape(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		d := 3 * time.Minute
		plan := schedule(seed, d, kinds)
		if len(plan) == 0 {
			t.Fatalf("seed %d: no faults", seed)
		}
		seen := map[string]bool{}
		for i, p := range plan {
			k, ok := kindNamed(p.Kind)
			if !ok {
				t.Fatalf("seed %d: unknown kind %q", seed, p.Kind)
			}
			seen[p.Kind] = true
			if p.Target < 0 || p.Target >= max(k.targets, 1) {
				t.Errorf("seed %d: %s target %d of %d", seed, p.Kind, p.Target, k.targets)
			}
			if k.max > 0 && (p.For < k.min || p.For > k.max) {
				t.Errorf("seed %d: %s held %v, want [%v, %v]", seed, p.Kind, p.For, k.min, k.max)
			}
			if k.max == 0 && p.For != 0 {
				t.Errorf("seed %d: %s is an act, held %v", seed, p.Kind, p.For)
			}
			if p.At+actLength > d+2*time.Second {
				t.Errorf("seed %d: %s at %v, past the run's %v", seed, p.Kind, p.At, d)
			}
			// Two faults that overlap never share a domain.
			for _, q := range plan[:i] {
				kq, _ := kindNamed(q.Kind)
				if overlap(p, q) && domainOf(k, p.Target) == domainOf(kq, q.Target) {
					t.Errorf("seed %d: %s and %s overlap on %s", seed, p, q, domainOf(k, p.Target))
				}
			}
		}
		// A round draws every kind before any again: a run of three
		// minutes meets most.
		if len(seen) < len(kinds)/2 {
			t.Errorf("seed %d: %d kinds of %d in 3 minutes", seed, len(seen), len(kinds))
		}
	}
}

func TestKindsNamed(t *testing.T) {
	ks, err := kindsNamed("redis pause, cpu hog")
	if err != nil || len(ks) != 2 || ks[0].name != "redis pause" || ks[1].name != "cpu hog" {
		t.Fatalf("got %v, %v", ks, err)
	}
	if _, err := kindsNamed("redis pause,unplug"); err == nil || !strings.Contains(err.Error(), "unplug") {
		t.Fatalf("an unknown kind: got %v", err)
	}
	if ks, _ := kindsNamed(""); len(ks) != len(kinds) {
		t.Fatalf("empty: %d kinds, want all %d", len(ks), len(kinds))
	}
}

func overlap(a, b planned) bool {
	end := func(p planned) time.Duration {
		if p.For > 0 {
			return p.At + p.For
		}
		return p.At + actLength
	}
	return a.At < end(b) && b.At < end(a)
}

func domainOf(k kind, target int) string {
	return strings.ReplaceAll(k.domain, "*", fmt.Sprint(target))
}
