package main

import (
	"slices"
	"testing"
	"time"
)

func TestSpreadOf(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100 down to 1, unsorted
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		want spread
	}{
		{"empty", nil, spread{}},
		{"one", ms(7), spread{7 * time.Millisecond, 7 * time.Millisecond, 7 * time.Millisecond}},
		{"two: p50 is the lower", ms(9, 3), spread{3 * time.Millisecond, 9 * time.Millisecond, 9 * time.Millisecond}},
		{"odd count", ms(5, 1, 4, 2, 3), spread{3 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond}},
		{"a hundred: ranks 50 and 99", ms(hundred...), spread{50 * time.Millisecond, 99 * time.Millisecond, 100 * time.Millisecond}},
		{"negative values sort first", ms(-20, 10, 0), spread{0, 10 * time.Millisecond, 10 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before []time.Duration
			before = append(before, tc.in...)
			if got := spreadOf(tc.in); got != tc.want {
				t.Errorf("spreadOf(%v) = %+v, want %+v", tc.in, got, tc.want)
			}
			for i := range before {
				if tc.in[i] != before[i] {
					t.Fatalf("spreadOf reordered its input: %v, was %v", tc.in, before)
				}
			}
		})
	}
}

func TestRatio(t *testing.T) {
	if r := ratio(3*time.Second, 2*time.Second); r != 1.5 {
		t.Errorf("ratio(3s, 2s) = %v, want 1.5", r)
	}
	if r := ratio(time.Second, 0); r != 0 {
		t.Errorf("ratio(1s, 0) = %v, want 0 (no infinity in JSON)", r)
	}
}

func TestJudge(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	g := func(id string, deadline, arrived int) arrival {
		return arrival{id: id, deadline: at(deadline), at: at(arrived)}
	}
	facts := []fact{
		{uid: "t-once", feed: feedTopic, silent: true, earned: at(0)},
		{uid: "t-once-late", feed: feedTopic, silent: true, earned: at(100)},
		{uid: "t-lost", feed: feedTopic, silent: true, earned: at(0)},
		{uid: "t-twice", feed: feedTopic, silent: true, earned: at(0)},
		{uid: "t-active", feed: feedTopic},
		{uid: "t-active-guided", feed: feedTopic},
		{uid: "w-once", feed: feedWebSocket, silent: true, earned: at(0)},
		{uid: "w-early", feed: feedWebSocket, silent: true, earned: at(1000)},
		{uid: "w-early-twice", feed: feedWebSocket, silent: true, earned: at(1000)},
		{uid: "w-at-earned", feed: feedWebSocket, silent: true, earned: at(500)},
		{uid: "w-active", feed: feedWebSocket},
	}
	guides := map[string][]arrival{
		"t-once":          {g("a", 10, 300)},
		"t-once-late":     {g("b", 120, 1120)},
		"t-twice":         {g("c", 0, 250), g("d", 0, 5000)},
		"t-active-guided": {g("e", 0, 10)},
		"w-once":          {g("f", 0, 40)},
		"w-early":         {g("g", 0, 999)},
		"w-early-twice":   {g("h", 0, 10), g("i", 0, 2000)},
		"w-at-earned":     {g("j", 490, 500)},
		"nobody":          {g("k", 0, 1)}, // a user the bench did not make: not counted
	}
	got := judge(facts, guides)

	topic := got[feedTopic]
	if topic.Silent != 4 || topic.Active != 2 || topic.Guided != 2 || topic.Lost != 1 || topic.Doubled != 1 ||
		topic.ActiveGuided != 1 || topic.Early != 0 {
		t.Errorf("topic: %+v, want 4 silent, 2 active, 2 guided once, 1 lost, 1 doubled, 1 active guided, 0 early", *topic)
	}
	if want := []time.Duration{290 * time.Millisecond, time.Second}; !slices.Equal(topic.late, want) {
		t.Errorf("topic lateness %v, want %v", topic.late, want)
	}

	ws := got[feedWebSocket]
	if ws.Silent != 4 || ws.Active != 1 || ws.Guided != 2 || ws.Lost != 0 || ws.Doubled != 1 ||
		ws.ActiveGuided != 0 || ws.Early != 2 {
		t.Errorf("websocket: %+v, want 4 silent, 1 active, 2 guided once (one at its earned deadline), 0 lost, 1 doubled, 0 active guided, 2 early", *ws)
	}
	if want := []time.Duration{40 * time.Millisecond, 10 * time.Millisecond}; !slices.Equal(ws.late, want) {
		t.Errorf("websocket lateness %v, want %v", ws.late, want)
	}
}
