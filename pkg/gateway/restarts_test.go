package gateway

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisconn"
)

// TestRestartedSince: a master whose run id changed since the last look
// restarted, at its uptime less a second back from the look (the uptime
// is in whole seconds of the clock, never a start too early); the
// earliest of several counts. A first look, a master first seen (a replica promoted) and one
// not read this time tell nothing, and one not read is still compared
// when it is read again.
func TestRestartedSince(t *testing.T) {
	now := time.Unix(1000, 0)
	run := func(id string, up int) redisconn.Run {
		return redisconn.Run{ID: id, Up: time.Duration(up) * time.Second}
	}
	type look = map[string]redisconn.Run
	for _, tc := range []struct {
		name  string
		looks []look
		fail  []bool          // per look after the first: the read failed for some master
		want  []time.Duration // per look after the first: how long before now the restart began; -1: none
	}{
		{name: "first look", looks: []look{{"a": run("1", 50)}}},
		{name: "no change", looks: []look{{"a": run("1", 50)}, {"a": run("1", 51)}}, want: []time.Duration{-1}},
		{name: "restart", looks: []look{{"a": run("1", 50)}, {"a": run("2", 3)}}, want: []time.Duration{2 * time.Second}},
		{name: "two restarts, the earliest counts", looks: []look{{"a": run("1", 50), "b": run("1", 50)}, {"a": run("2", 3), "b": run("2", 7)}},
			want: []time.Duration{6 * time.Second}},
		{name: "master first seen", looks: []look{{"a": run("1", 50)}, {"a": run("1", 51), "b": run("9", 600)}}, want: []time.Duration{-1}},
		{name: "not read, then read restarted", looks: []look{{"a": run("1", 50), "b": run("1", 50)}, {"a": run("1", 51)}, {"a": run("1", 52), "b": run("2", 1)}},
			fail: []bool{true, false}, want: []time.Duration{-1, 0}},
		{name: "a master no longer, then promoted again", looks: []look{{"a": run("1", 50), "b": run("1", 50)}, {"a": run("1", 51)}, {"a": run("1", 52), "b": run("7", 300)}},
			want: []time.Duration{-1, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := map[string]redisconn.Run{}
			if _, ok := restartedSince(runs, tc.looks[0], true, now); ok {
				t.Fatalf("the first look saw a restart")
			}
			for i, l := range tc.looks[1:] {
				since, ok := restartedSince(runs, l, i >= len(tc.fail) || !tc.fail[i], now)
				switch want := tc.want[i]; {
				case want < 0 && ok:
					t.Errorf("look %d: a restart since %v, want none", i+1, since)
				case want >= 0 && (!ok || !since.Equal(now.Add(-want))):
					t.Errorf("look %d: restarted %v since %v, want since %v", i+1, ok, since, now.Add(-want))
				}
			}
		})
	}
}
