package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// kind is one kind of fault the schedule composes: how many targets it
// has (gateways, masters, ...), how long its window lasts, and the
// domain two faults of one window must not share (one Redis fault at a
// time, one fault per process).
type kind struct {
	name     string
	targets  int
	min, max time.Duration
	// domain: faults of the same domain and target never overlap; "*"
	// in it stands for the target.
	domain string
}

// kinds are the faults implemented, by name. The schedule draws from
// them in a shuffled round, so that a run of a few minutes meets each.
var kinds = []kind{
	{name: "sigstop gateway", targets: nGateways, min: 2 * time.Second, max: 6 * time.Second, domain: "gateway-*"},
	{name: "sigstop listener", targets: nListeners, min: 2 * time.Second, max: 6 * time.Second, domain: "listener-*"},
	{name: "sigstop consumer", targets: nConsumers, min: 2 * time.Second, max: 6 * time.Second, domain: "consumer-*"},
	{name: "sigkill gateway", targets: nGateways, min: 1 * time.Second, max: 4 * time.Second, domain: "gateway-*"},
	{name: "sigkill listener", targets: nListeners, min: 1 * time.Second, max: 4 * time.Second, domain: "listener-*"},
	{name: "sigkill consumer", targets: nConsumers, min: 1 * time.Second, max: 4 * time.Second, domain: "consumer-*"},
	{name: "cut user-gateway", targets: nGateways, min: 2 * time.Second, max: 6 * time.Second, domain: "gateway-*"},
	{name: "cut activity-gateway", targets: nGateways, min: 2 * time.Second, max: 6 * time.Second, domain: "gateway-*"},
	{name: "cut consumer-gateway", targets: nConsumers, min: 2 * time.Second, max: 6 * time.Second, domain: "push-*"},
	{name: "redis pause", targets: nMasters, min: 2 * time.Second, max: 5 * time.Second, domain: "redis"},
	{name: "redis failover graceful", targets: nMasters, domain: "redis"},
	{name: "redis failover hard", targets: nMasters, domain: "redis"},
	{name: "redis restart empty", targets: nMasters, domain: "redis"},
	{name: "redis reshard", targets: nMasters, domain: "redis"},
	{name: "kafka refuse produce", targets: 1, min: 4 * time.Second, max: 10 * time.Second, domain: "kafka"},
	{name: "kafka refuse fetch", targets: 1, min: 2 * time.Second, max: 6 * time.Second, domain: "kafka"},
	{name: "cpu hog", targets: 1, min: 3 * time.Second, max: 6 * time.Second, domain: "cpu"},
	{name: "push duplicate", targets: nConsumers, min: 3 * time.Second, max: 8 * time.Second, domain: "push-*"},
	{name: "push reorder", targets: nConsumers, min: 3 * time.Second, max: 8 * time.Second, domain: "push-*"},
	// Not a fault of the stack's: a third of the users fall silent at
	// once, past every stage, as a lost network on their side would
	// make them. The mass-expiry brake holds their guides for the grace;
	// they come late, not lost.
	{name: "mass silence", targets: 3, min: 10 * time.Second, max: 14 * time.Second, domain: "users"},
}

// notImplemented are the fault kinds of the issue this suite does not
// cause yet, and why, for the report.
var notImplemented = []string{
	"clock step on a gateway or listener host: not implemented; faketime (LD_PRELOAD) does not reach Go binaries, whose runtime reads the clock through the vDSO, not libc",
	"TCP cut between a service and Redis: the cluster's nodes announce their own addresses, so a proxy sees only the first connection",
	"TCP cut between a service and Kafka: kfake advertises its own address in metadata, so a proxy sees only the bootstrap; Kafka refusing produce or fetch stands in",
}

func kindNamed(name string) (kind, bool) {
	for _, k := range kinds {
		if k.name == name {
			return k, true
		}
	}
	return kind{}, false
}

// kindsNamed picks kinds by a comma-separated list; empty: all.
func kindsNamed(list string) ([]kind, error) {
	if strings.TrimSpace(list) == "" {
		return kinds, nil
	}
	var out []kind
	for _, n := range strings.Split(list, ",") {
		k, ok := kindNamed(strings.TrimSpace(n))
		if !ok {
			return nil, fmt.Errorf("unknown fault kind %q", n)
		}
		out = append(out, k)
	}
	return out, nil
}

// planned is one fault of the schedule: its kind and target, when it
// begins (from the schedule's start) and how long it is held. A fault
// with no length (a failover, a reshard) is one act, its window as long
// as the act takes.
type planned struct {
	Kind   string
	Target int
	At     time.Duration
	For    time.Duration
}

func (p planned) String() string {
	return fmt.Sprintf("%7.1fs  %-24s target %d  for %v", p.At.Seconds(), p.Kind, p.Target, p.For)
}

// Schedule shape.
const (
	// quietMin and quietMax bound the quiet after each window: the stack
	// heals, the stages the window held come due.
	quietMin = 4 * time.Second
	quietMax = 9 * time.Second
	// actLength is the time kept for a fault with no length of its own
	// (the act itself, then the cluster settling).
	actLength = 6 * time.Second
	// twoShare is the share (in percent) of windows with two faults.
	twoShare = 40
)

// schedule composes the faults of a run of length d from seed: windows
// of one or two faults of different domains, each followed by a quiet.
// The same seed, length and kinds give the same schedule.
func schedule(seed uint64, d time.Duration, ks []kind) []planned {
	rnd := rand.New(rand.NewPCG(seed, 0x5eed))
	var out []planned
	var round []kind
	next := func() kind {
		if len(round) == 0 {
			round = slices.Clone(ks)
			rnd.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		}
		k := round[0]
		round = round[1:]
		return k
	}
	t := time.Duration(0)
	for t+actLength < d {
		n := 1
		if rnd.IntN(100) < twoShare {
			n = 2
		}
		end := t
		var taken []string
		for i := range n {
			k := next()
			target := rnd.IntN(max(k.targets, 1))
			dom := strings.ReplaceAll(k.domain, "*", fmt.Sprint(target))
			if slices.Contains(taken, dom) {
				round = append(round, k) // drawn again in this round
				continue
			}
			taken = append(taken, dom)
			p := planned{Kind: k.name, Target: target, At: t}
			if i > 0 {
				p.At += time.Duration(rnd.Int64N(int64(2 * time.Second)))
			}
			length := actLength
			if k.max > 0 {
				p.For = k.min + time.Duration(rnd.Int64N(int64(k.max-k.min)+1))
				length = p.For
			}
			out = append(out, p)
			end = max(end, p.At+length)
		}
		t = end + quietMin + time.Duration(rnd.Int64N(int64(quietMax-quietMin)))
	}
	return out
}
