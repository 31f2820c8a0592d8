package expiry

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

func TestOutageHold(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	const grace = 10 * time.Second
	alive := session.Instance{Last: at(99), Lease: 3 * time.Second}
	dead := session.Instance{Last: at(50), Lease: 3 * time.Second}
	blind := func(from, to float64, scope string) session.BlindInterval {
		return session.BlindInterval{Start: at(from), End: at(to), Scope: scope, Reason: "test"}
	}
	drain := func(from, to float64, scope string) session.BlindInterval {
		return session.BlindInterval{Start: at(from), End: at(to), Scope: scope, Reason: session.BlindDrain}
	}
	lag := func(from, to float64) session.BlindInterval {
		return session.BlindInterval{Start: at(from), End: at(to), Reason: session.BlindActivityLag}
	}
	tests := []struct {
		name      string
		now       float64
		deadline  float64
		via       string
		routes    []string
		blind     []session.BlindInterval
		inst      map[string]session.Instance
		feed      map[int32]float64 // the activity watermark by partition
		stamp     time.Duration     // how often the feed stamps it; 0 not known
		unstamped bool              // a feed member started and nothing is stamped
		until     float64           // 0: produce now
		rule      holdRule
	}{
		{name: "no outage", now: 100, deadline: 99},
		{name: "deadline before a blind interval", now: 100, deadline: 39.9,
			blind: []session.BlindInterval{blind(40, 60, "")}},
		{name: "deadline in a blind interval", now: 61, deadline: 50,
			blind: []session.BlindInterval{blind(40, 60, "")}, until: 70, rule: ruleBlind},
		{name: "deadline at its start", now: 61, deadline: 40,
			blind: []session.BlindInterval{blind(40, 60, "")}, until: 70, rule: ruleBlind},
		{name: "deadline within the grace after it", now: 65, deadline: 64,
			blind: []session.BlindInterval{blind(40, 60, "")}, until: 70, rule: ruleBlind},
		{name: "deadline past the grace", now: 75, deadline: 70.1,
			blind: []session.BlindInterval{blind(40, 60, "")}},
		{name: "grace over: the recheck produces", now: 70, deadline: 50,
			blind: []session.BlindInterval{blind(40, 60, "")}},
		{name: "the latest of two intervals", now: 81, deadline: 66,
			blind: []session.BlindInterval{blind(40, 60, ""), blind(65, 80, "")}, until: 90, rule: ruleBlind},
		{name: "another gateway's interval", now: 61, deadline: 50, via: "gw-a",
			blind: []session.BlindInterval{blind(40, 60, "gw-b")}},
		{name: "own gateway's interval", now: 61, deadline: 50, via: "gw-b",
			blind: []session.BlindInterval{blind(40, 60, "gw-b")}, until: 70, rule: ruleBlind},
		{name: "gateway-scoped interval, no via", now: 61, deadline: 50,
			blind: []session.BlindInterval{blind(40, 60, "gw-b")}},
		{name: "live gateway", now: 100, deadline: 99, via: "gw-a",
			inst: map[string]session.Instance{"gw-a": alive, "gw-b": dead}},
		{name: "dead gateway, deadline after its death", now: 55, deadline: 54, via: "gw-b",
			inst: map[string]session.Instance{"gw-a": alive, "gw-b": dead}, until: 60, rule: ruleGatewayDead},
		{name: "dead gateway, deadline just before its last heartbeat", now: 55, deadline: 48, via: "gw-b",
			inst: map[string]session.Instance{"gw-a": alive, "gw-b": dead}, until: 60, rule: ruleGatewayDead},
		{name: "dead gateway, silent long before it died", now: 55, deadline: 40, via: "gw-b",
			inst: map[string]session.Instance{"gw-a": alive, "gw-b": dead}},
		{name: "dead gateway, grace over", now: 60, deadline: 54, via: "gw-b",
			inst: map[string]session.Instance{"gw-a": alive, "gw-b": dead}},
		{name: "gateway late with its heartbeat", now: 99 + 1.3, deadline: 100, via: "gw-a",
			inst: map[string]session.Instance{"gw-a": alive}, until: 109, rule: ruleGatewayDead},
		{name: "gateway within its heartbeat slack", now: 99 + 1.2, deadline: 100, via: "gw-a",
			inst: map[string]session.Instance{"gw-a": alive}},
		{name: "a second device's gateway is dead", now: 55, deadline: 54, via: "gw-a", routes: []string{"gw-a", "gw-b"},
			inst: map[string]session.Instance{"gw-a": alive, "gw-b": dead}, until: 60, rule: ruleGatewayDead},
		{name: "a second device's gateway's interval", now: 61, deadline: 50, via: "gw-a", routes: []string{"gw-b"},
			blind: []session.BlindInterval{blind(40, 60, "gw-b")}, until: 70, rule: ruleBlind},
		// A stopping gateway records its drain while it lasts; it still
		// beats, but the users it told to go reconnect elsewhere.
		{name: "draining gateway, still beating", now: 99.5, deadline: 99, via: "gw-a",
			inst:  map[string]session.Instance{"gw-a": alive},
			blind: []session.BlindInterval{drain(97, 99.4, "gw-a")}, until: 109.4, rule: ruleBlind},
		{name: "silent before its gateway began to drain", now: 99.5, deadline: 96.9, via: "gw-a",
			inst:  map[string]session.Instance{"gw-a": alive},
			blind: []session.BlindInterval{drain(97, 99.4, "gw-a")}},
		{name: "unknown gateway", now: 55, deadline: 54, via: "gw-c",
			inst: map[string]session.Instance{"gw-a": alive, "gw-b": dead}},
		{name: "fleet down", now: 100, deadline: 99, via: "gw-b",
			inst: map[string]session.Instance{"gw-b": dead}, until: 110, rule: ruleFleetDown},
		{name: "fleet down, renewed without a gateway", now: 100, deadline: 99,
			inst: map[string]session.Instance{"gw-b": dead}, until: 110, rule: ruleFleetDown},
		{name: "fleet down, deadline before it", now: 100, deadline: 40,
			inst: map[string]session.Instance{"gw-b": dead}},
		{name: "no gateway ever", now: 100, deadline: 99},
		// The activity feed's watermark: the earliest partition's time.
		{name: "activity applied past the deadline", now: 100, deadline: 99,
			feed: map[int32]float64{0: 99.9, 1: 99.5}},
		{name: "activity not yet applied past it: held as long as the feed lags", now: 100, deadline: 99.5,
			feed: map[int32]float64{0: 99.9, 1: 99.5}, until: 100.5, rule: ruleActivityLag},
		{name: "a feed just behind: held for the recheck at least", now: 100, deadline: 99.98,
			feed: map[int32]float64{0: 99.97}, until: 100.1, rule: ruleActivityLag},
		{name: "a feed down: held for the grace at most", now: 100, deadline: 60,
			feed: map[int32]float64{0: 99.9, 1: 50}, until: 110, rule: ruleActivityLag},
		{name: "a feed down, deadline before it", now: 100, deadline: 49,
			feed: map[int32]float64{0: 99.9, 1: 50}},
		// With the stamp known: held until the stamp that can pass the
		// deadline has landed (activityRelease has the cases).
		{name: "a feed on its cadence: held to the next stamp and its slack", now: 100, deadline: 99.98,
			feed: map[int32]float64{0: 99.97, 1: 99.99}, stamp: 250 * time.Millisecond, until: 100.27, rule: ruleActivityLag},
		{name: "a feed on its cadence, applied past the deadline", now: 100, deadline: 99.96,
			feed: map[int32]float64{0: 99.97, 1: 99.99}, stamp: 250 * time.Millisecond},
		{name: "a feed stalled: held as long again as it lags, with the stamp known", now: 100, deadline: 99.5,
			feed: map[int32]float64{0: 99, 1: 99.99}, stamp: 250 * time.Millisecond, until: 101, rule: ruleActivityLag},
		// The feed's lag, a blind interval: the records the platform
		// appended within the grace after it must be applied before its
		// deadlines are judged.
		{name: "feed's lag, within its grace", now: 65, deadline: 50, feed: map[int32]float64{0: 64},
			blind: []session.BlindInterval{lag(40, 60)}, until: 70, rule: ruleBlind},
		{name: "feed's lag, grace over, watermark short of it: held as long as the feed lags", now: 71, deadline: 50,
			feed: map[int32]float64{0: 69, 1: 65}, blind: []session.BlindInterval{lag(40, 60)}, until: 77, rule: ruleBlind},
		{name: "feed's lag, grace over, watermark just short of it: the recheck at least", now: 70.05, deadline: 50,
			feed: map[int32]float64{0: 69.99}, blind: []session.BlindInterval{lag(40, 60)}, until: 70.15, rule: ruleBlind},
		{name: "feed's lag, grace over, feed down since: the grace at most", now: 100, deadline: 50,
			feed: map[int32]float64{0: 62}, blind: []session.BlindInterval{lag(40, 60)}, until: 110, rule: ruleBlind},
		{name: "feed's lag, watermark past its grace", now: 71, deadline: 50,
			feed: map[int32]float64{0: 70}, blind: []session.BlindInterval{lag(40, 60)}},
		{name: "feed's lag, feed forgotten: its grace only", now: 71, deadline: 50,
			blind: []session.BlindInterval{lag(40, 60)}},
		{name: "another blind interval does not wait for the watermark", now: 71, deadline: 50,
			feed: map[int32]float64{0: 55}, blind: []session.BlindInterval{blind(40, 60, "")}},
		// A feed that started and never stamped (Kafka down since): every
		// deadline is held, as by a partition nobody stamped.
		{name: "a feed that never stamped", now: 100, deadline: 99, unstamped: true, until: 110, rule: ruleActivityLag},
		{name: "a feed that stamped since it started", now: 100, deadline: 99, unstamped: true,
			feed: map[int32]float64{0: 99.5}},
		{name: "a blind interval outlasts the feed's hold", now: 100, deadline: 95,
			feed:  map[int32]float64{0: 94},
			blind: []session.BlindInterval{blind(90, 99, "")}, until: 109, rule: ruleBlind},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := session.Control{Now: at(tt.now), Blind: tt.blind, Instances: tt.inst, ActivityStamp: tt.stamp, ActivityUnstamped: tt.unstamped}
			for p, w := range tt.feed {
				if c.Activity == nil {
					c.Activity = map[int32]time.Time{}
				}
				c.Activity[p] = at(w)
			}
			e := session.Expired{UID: "u", Deadline: at(tt.deadline), Stage: 1, Due: at(tt.deadline), Via: tt.via, Routes: tt.routes}
			o := outageHold(c, e, grace)
			until, rule := o.release, o.rule
			var want time.Time
			if tt.until != 0 {
				want = at(tt.until)
			}
			if !until.Equal(want) || rule != tt.rule {
				t.Errorf("outageHold = %v %q, want %v %q", until.Sub(t0), rule, want.Sub(t0), tt.rule)
			}
		})
	}
}

// TestActivityRelease: a deadline past the activity feed's watermark is
// held until the stamp that can move the watermark past it has landed,
// once, while the feed keeps its cadence; off it, or with the stamp not
// known, as long again as the feed lags.
func TestActivityRelease(t *testing.T) {
	w := time.UnixMilli(1_800_000_000_000) // the watermark
	ms := func(n int) time.Time { return w.Add(time.Duration(n) * time.Millisecond) }
	const stamp, grace = 250 * time.Millisecond, 10 * time.Second
	tests := []struct {
		name    string
		now, d  int // ms past the watermark
		stamp   time.Duration
		grace   time.Duration
		release int // ms past the watermark
	}{
		// The next stamp starts at w+250 and lands by w+300.
		{name: "just stamped", now: 20, d: 10, release: 300},
		{name: "deadline at the watermark", now: 5, d: 0, release: 300},
		{name: "a stamp due any moment: the floor", now: 290, d: 240, release: 290 + 25},
		{name: "deadline past the stamp due: the one after", now: 290, d: 280, release: 550},
		{name: "the stamp landed within its slack", now: 299, d: 249, release: 299 + 25},
		// w+250 landed and left w: the partition trails by a stamp, the
		// watermark moves to w+250 with the stamp at w+500.
		{name: "trailing by a stamp", now: 320, d: 100, release: 550},
		{name: "trailing, deadline past the stamp that landed", now: 320, d: 300, release: 800},
		{name: "trailing at the edge of the cadence", now: 549, d: 540, release: 1050},
		// More than two stamps and the slack: off the cadence.
		{name: "a feed stalled", now: 550, d: 500, release: 1100},
		{name: "a feed stalled long: the grace", now: 60_000, d: 500, release: 70_000},
		{name: "stamp not known: as long as the feed lags", stamp: -1, now: 400, d: 390, release: 800},
		{name: "stamp not known, just behind: the recheck", stamp: -1, now: 30, d: 20, release: 130},
		{name: "a slow stamp: at most the grace", stamp: 5 * time.Second, grace: time.Second, now: 100, d: 50, release: 1100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, g := stamp, grace
			if tt.stamp != 0 {
				s = max(tt.stamp, 0)
			}
			if tt.grace != 0 {
				g = tt.grace
			}
			got := activityRelease(ms(tt.now), w, ms(tt.d), s, g)
			if !got.Equal(ms(tt.release)) {
				t.Errorf("activityRelease(now w+%dms, d w+%dms) = w+%v, want w+%dms", tt.now, tt.d, got.Sub(w), tt.release)
			}
			if !got.After(ms(tt.now)) {
				t.Errorf("released at w+%v, not after now", got.Sub(w))
			}
		})
	}
}

func TestActivityLag(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tt := range []struct {
		name string
		c    session.Control
		want time.Duration
	}{
		{"no feed", session.Control{Now: now}, 0},
		{"the earliest partition's", session.Control{Now: now, Activity: map[int32]time.Time{0: now.Add(-time.Second), 1: now.Add(-5 * time.Second)}}, 5 * time.Second},
		{"ahead of the clock", session.Control{Now: now, Activity: map[int32]time.Time{0: now.Add(time.Second)}}, 0},
		{"never stamped", session.Control{Now: now, ActivityUnstamped: true}, now.Sub(time.UnixMilli(0))},
	} {
		if got := activityLag(tt.c); got != tt.want {
			t.Errorf("%s: lag %v, want %v", tt.name, got, tt.want)
		}
	}
}
