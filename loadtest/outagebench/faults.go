package main

import (
	"context"
	"fmt"
	"strings"
)

// fault is one outage the bench causes and ends.
type fault struct {
	name, what string
	inject     func(ctx context.Context, r *rig) error
	// recover ends the fault and returns once the part it broke is back.
	recover func(ctx context.Context, r *rig) error
}

var allFaults = []fault{
	{
		name: "redis-pause",
		what: "redis-server stopped with SIGSTOP, then resumed: every connection hangs, nothing is answered",
		inject: func(_ context.Context, r *rig) error {
			r.redis.Pause()
			return nil
		},
		recover: func(_ context.Context, r *rig) error {
			r.redis.Resume()
			return nil
		},
	},
	{
		name: "redis-restart",
		what: "redis-server killed (SIGKILL), then started again, reloading its append-only file (fsync always)",
		inject: func(_ context.Context, r *rig) error {
			r.redis.Kill()
			return nil
		},
		recover: func(ctx context.Context, r *rig) error { return r.redis.Restart(ctx) },
	},
	{
		name: "redis-cut",
		what: "the gateways' path to Redis cut at a TCP proxy (connections closed, new ones refused), then restored; the listener and consumer still reach Redis",
		inject: func(_ context.Context, r *rig) error {
			r.proxy.Cut()
			return nil
		},
		recover: func(_ context.Context, r *rig) error {
			r.proxy.Restore()
			return nil
		},
	},
	{
		name: "gateways-down",
		what: "every gateway process killed (SIGKILL), the users reconnecting on their own all along, then started again (new instance ids, same addresses)",
		inject: func(_ context.Context, r *rig) error {
			r.gws.kill()
			return nil
		},
		recover: func(ctx context.Context, r *rig) error { return r.gws.start(ctx) },
	},
}

// faultsNamed picks faults by name, in the order given.
func faultsNamed(list string) ([]fault, error) {
	var out []fault
	var names []string
	for _, f := range allFaults {
		names = append(names, f.name)
	}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		found := false
		for _, f := range allFaults {
			if f.name == n {
				out, found = append(out, f), true
			}
		}
		if !found {
			return nil, fmt.Errorf("-faults: unknown fault %q (want some of %s)", n, strings.Join(names, ","))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-faults: none given")
	}
	return out, nil
}
