package main

import (
	"slices"
	"time"
)

// Who keeps a user's session alive.
type feed string

const (
	feedTopic     feed = "topic"     // `active` events on the activity topic, no WebSocket
	feedWebSocket feed = "websocket" // pings on a WebSocket
)

// fact is what the bench knows of one user once the run is over.
type fact struct {
	uid  string
	feed feed
	// silent says the user went silent during the run; the others stayed
	// active until the guides were counted.
	silent bool
	// earned is the earliest the deadline of the user's last activity can
	// be: a guide before it came while the user was there.
	earned time.Time
}

// arrival is one distinct guide (by id) for a user's first stage.
type arrival struct {
	id       string
	deadline time.Time // the deadline it names, by Redis's clock
	at       time.Time // its first arrival at the webhook
}

// tally is one feed's outcome.
type tally struct {
	Silent int `json:"silent"` // users who went silent
	Active int `json:"active"` // users active throughout
	// Guided counts silent users guided exactly once, at or after the
	// deadline they earned; Lost those never guided; Doubled those
	// guided more than once.
	Guided  int `json:"guided_once"`
	Lost    int `json:"lost"`
	Doubled int `json:"doubled"`
	// ActiveGuided counts active users who got a guide; Early silent
	// users guided before the deadline their last activity earned.
	// Both are guides to users who were there: the goal is none.
	ActiveGuided int `json:"active_guided"`
	Early        int `json:"guided_early"`
	// Lateness of each silent user's guide: its arrival minus the
	// deadline it names, for those guided once.
	late []time.Duration
}

// judge counts, for each feed, what became of its users: guides holds
// the distinct guides each uid got, in arrival order.
func judge(facts []fact, guides map[string][]arrival) map[feed]*tally {
	out := map[feed]*tally{feedTopic: {}, feedWebSocket: {}}
	for _, f := range facts {
		t := out[f.feed]
		if t == nil {
			t = &tally{}
			out[f.feed] = t
		}
		gs := guides[f.uid]
		if !f.silent {
			t.Active++
			if len(gs) > 0 {
				t.ActiveGuided++
			}
			continue
		}
		t.Silent++
		if len(gs) > 0 && gs[0].at.Before(f.earned) {
			t.Early++
		}
		switch {
		case len(gs) == 0:
			t.Lost++
		case len(gs) > 1:
			t.Doubled++
		case !gs[0].at.Before(f.earned):
			t.Guided++
			t.late = append(t.late, gs[0].at.Sub(gs[0].deadline))
		}
	}
	return out
}

// spread is the p50, p99 and max of a sample, by nearest rank: the
// smallest value with at least that share of the sample at or below it.
// All are zero for an empty sample; d is left as it was.
type spread struct {
	P50, P99, Max time.Duration
}

func spreadOf(d []time.Duration) spread {
	if len(d) == 0 {
		return spread{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := func(q float64) time.Duration {
		// ceil(q × n), from 1, without float rounding up an exact product.
		n := len(s)
		r := int(q * float64(n))
		if float64(r) < q*float64(n) {
			r++
		}
		return s[min(max(r, 1), n)-1]
	}
	return spread{P50: rank(0.50), P99: rank(0.99), Max: s[len(s)-1]}
}

// ratio is a/b, or 0 when b is not positive: JSON has no infinity.
func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}
