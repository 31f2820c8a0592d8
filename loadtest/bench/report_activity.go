package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ActivityLateness is activitybench's lateness part: guide lateness of
// users kept alive only through the activity topic beside users kept
// alive by WebSocket pings, in one stack with the feed on; and the
// WebSocket users alone with the feed off.
type ActivityLateness struct {
	SilentPerFeed int             `json:"silent_per_feed"`
	ActivePerFeed int             `json:"active_per_feed"`
	TTLMS         float64         `json:"ttl_ms"`
	StampMS       float64         `json:"stamp_ms"`
	SpreadMS      float64         `json:"spread_ms"`
	GraceMS       float64         `json:"grace_ms"`
	Partitions    int             `json:"partitions"`
	Topic         LatenessOfFeed  `json:"topic"`
	WebSocket     LatenessOfFeed  `json:"websocket"`
	RatioP50      float64         `json:"ratio_p50"`
	RatioP99      float64         `json:"ratio_p99"`
	RatioMax      float64         `json:"ratio_max"`
	Held          map[string]int  `json:"held"`
	Posts         int             `json:"webhook_posts"`
	LaterStages   int             `json:"later_stages"`
	Dropped       int             `json:"dropped_pings"`
	Baseline      *LatenessOfFeed `json:"baseline_feed_off,omitempty"`
	OverBaseline  float64         `json:"websocket_over_baseline_p50,omitempty"`
	Seconds       float64         `json:"seconds"`
}

// LatenessOfFeed is one crowd: what became of its users, and how late
// the silent ones' guides came past the deadline each names.
type LatenessOfFeed struct {
	Silent       int            `json:"silent"`
	Active       int            `json:"active"`
	Guided       int            `json:"guided_once"`
	Lost         int            `json:"lost"`
	Doubled      int            `json:"doubled"`
	ActiveGuided int            `json:"active_guided"`
	Early        int            `json:"guided_early"`
	P50ms        float64        `json:"late_p50_ms"`
	P99ms        float64        `json:"late_p99_ms"`
	Maxms        float64        `json:"late_max_ms"`
	Held         map[string]int `json:"held,omitempty"` // the baseline's only
}

// wrong reports a guide lost, doubled, or to a user who was there.
func (f LatenessOfFeed) wrong() bool {
	return f.Lost > 0 || f.Doubled > 0 || f.ActiveGuided > 0 || f.Early > 0 || f.Guided < f.Silent
}

// crowd is one crowd of the lateness run, by name.
type crowd struct {
	name string
	f    LatenessOfFeed
}

// crowds are the crowds the lateness run ran.
func (l *ActivityLateness) crowds() []crowd {
	out := []crowd{{"topic-fed, feed on", l.Topic}, {"WebSocket-fed, feed on", l.WebSocket}}
	if l.Baseline != nil {
		out = append(out, crowd{"WebSocket-fed, feed off", *l.Baseline})
	}
	return out
}

// activityJudge adds the lateness run's lost-or-doubled lines and says
// whether any guide was wrong.
func (r *Report) activityJudge(line func(step string, lost, doubled int, note string)) (bad bool) {
	a := r.Activity
	if a == nil || a.Lateness == nil {
		return false
	}
	for _, c := range a.Lateness.crowds() {
		line("5b activity lateness, "+c.name, c.f.Lost, c.f.Doubled,
			fmt.Sprintf("%d of %d silent users guided once; %d of %d active users guided, %d guided before their deadline",
				c.f.Guided, c.f.Silent, c.f.ActiveGuided, c.f.Active, c.f.Early))
		bad = bad || c.f.wrong()
	}
	return bad
}

func (r *Report) activityRows(a *Activity, row func(step, fig, val, goal, st, cmd string)) {
	for _, t := range a.Throughput {
		row("5b", "activity events applied per second through the topic, one gateway, "+t.redisName(),
			fmt.Sprintf("**%.0f**; Redis %.1f µs of CPU per event, %s", t.EventsPerSecond, t.Redis.CPUMicros, t.coresText()),
			"at least 50,000", r.status(t.EventsPerSecond >= goalActivityPerSecond, false), a.Command)
	}
	l := a.Lateness
	if l == nil {
		return
	}
	for _, c := range l.crowds() {
		row("5b", fmt.Sprintf("guide lateness past the deadline, %s (p50 / p99 / max)", c.name),
			fmt.Sprintf("%.0f / **%.0f** / %.0f ms; %d lost, %d doubled, %d to users who were there", c.f.P50ms, c.f.P99ms, c.f.Maxms,
				c.f.Lost, c.f.Doubled, c.f.ActiveGuided+c.f.Early),
			"each silent user once; none to a user who was there", r.status(!c.f.wrong(), false), a.Command)
	}
	row("5b", "topic-fed over WebSocket-fed lateness (p50 / p99 / max)", fmt.Sprintf("**%.2f** / %.2f / %.2f", l.RatioP50, l.RatioP99, l.RatioMax),
		"", "", a.Command)
}

func (r *Report) activityMD(b *strings.Builder, a *Activity) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("\n## 5b. Activity feed\n\n`%s`\n\n", a.Command)
	p("Throughput: %d `active` events of %d users wait on the activity topic (%d partitions); one gateway with the feed starts, the group's only member, and is timed until the feed's watermark in Redis has passed the last event: every event applied, as the listener sees it. It fails unless every user has a session after. It runs once on one redis-server and once on a Redis Cluster of two masters (the slots split evenly, both on this machine), each with its own embedded Kafka and the same events.\n\n",
		a.Events, a.Users, a.Partitions)
	p("| Redis | events applied per second | Redis CPU per event, all masters | each master's main thread | this process's CPU per event (gateway, embedded Kafka) | live sessions after |\n|---|---|---|---|---|---|\n")
	for _, t := range a.Throughput {
		p("| %s | **%.0f** (%.1f s) | %.1f µs | %s | %.1f µs | %d |\n", t.redisName(), t.EventsPerSecond, t.Seconds, t.Redis.CPUMicros,
			coresList(t.RedisCores), t.ProcessCPUMicros, t.Sessions)
	}
	p("\nEach event is one step of a Lua script run for a batch of a bucket's events: it reads the user's session, renewal and turn keys, and writes the session, the deadline index and the renewal. Redis runs scripts on one thread, so one redis-server's events per second are about one core over its CPU per event; a Redis Cluster spreads the buckets, and so the scripts, over its masters, and the same gateway applies more.\n")
	l := a.Lateness
	if l == nil {
		return
	}
	p("\nLateness (%.0f s): the dev stack in one process (redis-server, embedded Kafka, one gateway with the feed on, `STILLTHERE_ACTIVITY_STAMP` %.0f ms, %d partitions; the listener; a guide consumer posting every guide to one webhook) and two crowds side by side: users kept alive only by `active` events on the activity topic, no WebSocket, and users kept alive by WebSocket pings, each acting every quarter of the %.0f s TTL (no jitter). Of each, %d go silent at the same known times, spread over %.0f s, and %d stay active until every guide is in. Lateness is a guide's arrival at the webhook minus the deadline it names (Redis's clock, on this machine). The silences are no storm: the mass-expiry brake's floor is raised above them (step 4 measures the brake). ",
		l.Seconds, l.StampMS, l.Partitions, l.TTLMS/1000, l.SilentPerFeed, l.SpreadMS/1000, l.ActivePerFeed)
	if l.Baseline != nil {
		p("Then the WebSocket crowd again, alone in a stack with the feed off: the lateness the feed's watermark adds to every guide.")
	}
	p("\n\n| crowd | silent | guided once | lost | doubled | active users guided | guided before their deadline | lateness p50 / p99 / max |\n|---|---|---|---|---|---|---|---|\n")
	for _, c := range l.crowds() {
		p("| %s | %d | %d | %d | %d | %d of %d | %d | %.0f / **%.0f** / %.0f ms |\n", c.name, c.f.Silent, c.f.Guided, c.f.Lost, c.f.Doubled,
			c.f.ActiveGuided, c.f.Active, c.f.Early, c.f.P50ms, c.f.P99ms, c.f.Maxms)
	}
	p("\nTopic-fed over WebSocket-fed: %.2f at p50, %.2f at p99, %.2f at the max. ", l.RatioP50, l.RatioP99, l.RatioMax)
	if l.Baseline != nil {
		p("WebSocket-fed with the feed on over the same with it off, at p50: %.1f×. ", l.OverBaseline)
	}
	p("With the feed on, the listener holds every deadline at or past the feed's watermark, whichever way its user is fed (a user with a WebSocket may have server-side activity too), until the stamp that can pass it has landed (the stamp interval is written beside the watermark; 50 ms after that stamp's time, a stamp later when the last one did not move the watermark), then checks it again, and holds it again while the watermark has not passed it; a feed more than two stamps behind, as long again as it lags (at least 100 ms, at most the grace). The listener held %s", heldList(l.Held))
	if n := l.Topic.Silent + l.WebSocket.Silent; n > 0 && l.Held["activity-lag"] > 0 {
		p(" (%.2f activity-lag holds per silent user)", float64(l.Held["activity-lag"])/float64(n))
	}
	if l.Baseline != nil {
		p("; with the feed off, %s", heldList(l.Baseline.Held))
	}
	p(". The webhook took %d posts; %d guides of a later stage; %d WebSocket pings could not be sent.\n", l.Posts, l.LaterStages, l.Dropped)
}

// redisName names the Redis of a run.
func (t ActivityThroughput) redisName() string {
	if t.RedisMasters > 1 {
		return fmt.Sprintf("Redis Cluster of %d masters", t.RedisMasters)
	}
	return "one redis-server"
}

// coresText says how busy the Redis of a run was.
func (t ActivityThroughput) coresText() string {
	if len(t.RedisCores) == 1 {
		return fmt.Sprintf("its thread %.2f cores busy", t.RedisCores[0])
	}
	return "its masters' threads " + coresList(t.RedisCores) + " busy"
}

func coresList(cores []float64) string {
	out := make([]string, len(cores))
	for i, c := range cores {
		out[i] = fmt.Sprintf("%.2f", c)
	}
	return strings.Join(out, " / ") + " cores"
}

func heldList(m map[string]int) string {
	if len(m) == 0 {
		return "nothing"
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%d timeouts by %s", m[k], k))
	}
	return strings.Join(out, ", ")
}
