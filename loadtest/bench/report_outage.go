package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

func (r *Report) outageMD(b *strings.Builder, o *Outage) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("\n## 6. Outage\n\n`%s`\n\n", o.Command)
	p("A silence we caused is not a silence. %d active users ping every %.1f s (TTL/4) over WebSockets to %d gateway processes and reconnect on their own whenever dropped; for each fault %d more stop pinging at times spread so that their deadlines fall from a few seconds before the fault to a few seconds past the grace after it (they keep their connections, as an app left open does). TTL %.1f s plus up to %.1f s of jitter, outage grace %.0f s, each fault %.0f s (2 TTL). The gateways reach a redis-server with its append-only file (fsync always) through a TCP proxy; the expiry listener and a guide consumer reach it directly; guides go to a webhook that counts them per user. The faults run one after another; the next starts once the previous one's grace has passed, and no silence is called lost before the grace and 5 s more have passed since its latest possible deadline.\n\n",
		o.Active, o.PingEveryMS/1000, o.Gateways, o.Silent, o.TTLMS/1000, o.JitterMS/1000, o.GraceMS/1000, o.OutageMS/1000)
	p("| fault | down | active users guided | silent users guided exactly once | delayed by it | extra delay p50 / p99 / max | lost | doubled | guided before their deadline |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range o.Faults {
		p("| %s | %.1f s | **%d** of %d (%.1f%%) | %d of %d | %d | %.1f / **%.1f** / %.1f s | %d | %d | %d |\n",
			f.Fault, f.DownMS/1000, f.ActiveGuided, f.Active, 100*f.ActiveGuidedShare, f.GuidedOnce, f.Silent, f.Affected,
			f.ExtraP50ms/1000, f.ExtraP99ms/1000, f.ExtraMaxms/1000, f.Lost, f.Doubled, f.Early)
	}
	p("\n*Active users guided*: users pinging throughout who were guided in the fault's phase (from its start to the next one's); the goal is none. *Delayed by it*: silent users whose deadline fell before the grace after the recovery ran out and whose guide came after the recovery; their *extra delay* is the guide's arrival at the webhook minus the later of their deadline and the recovery (at most about the grace, by design). A silent user's deadline is the later of the one their last answered ping earned (send time plus the TTL granted; plus the TTL alone when the gateway answered `unavailable`) and the one their guide names. *Guided before their deadline*: users guided before the deadline their last answered ping earned, that is while they were there. The bench fails when an active user is guided, a user is guided before their deadline, or a silent user is lost or doubled.\n")
	for _, f := range o.Faults {
		p("\n**%s**: %s. ", f.Fault, f.What)
		p("The silent users not delayed by it were guided %.0f ms (p99) after their deadline. ", f.OthersP99ms)
		if len(f.Held) > 0 {
			var held []string
			for _, k := range slices.Sorted(maps.Keys(f.Held)) {
				held = append(held, fmt.Sprintf("%d %s", f.Held[k], k))
			}
			p("The listener held %s. ", strings.Join(held, ", "))
		} else {
			p("The listener held nothing. ")
		}
		p("The users tried %d connects in the phase.\n", f.Dials)
		if len(f.Blind) > 0 {
			p("\n- blind intervals recorded (from the fault's start): %s\n", strings.Join(f.Blind, "; "))
		}
		if len(f.Logs) > 0 {
			p("- log lines in the phase: %s\n", strings.Join(f.Logs, "; "))
		}
		for _, e := range f.Evidence {
			p("- %s\n", e)
		}
	}
}
