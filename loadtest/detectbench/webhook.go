package main

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// webhook records the guides posted to it for uids starting with prefix,
// stage 1 apart from later stages;
// others (a silence an earlier mode missed, found by a later sweep) are
// answered and not counted.
type webhook struct {
	prefix string

	mu     sync.Mutex
	ids    map[string]int // posts per guide id
	users  map[string]int // distinct guide ids per uid and stage
	lags   []float64      // stage 1: arrival minus deadline, ms, per first post of an id
	later  []float64      // later stages: arrival minus when the stage was due, ms
	firsts []time.Time    // arrival of the first post of each id
	posts  int
	last   time.Time
}

func newWebhook(prefix string) *webhook {
	return &webhook{prefix: prefix, ids: map[string]int{}, users: map[string]int{}}
}

// take records the guide of one post's body and says the status to
// answer: 400 for a body that is no guide.
func (h *webhook) take(b []byte) int {
	var body struct {
		ID         string `json:"id"`
		UID        string `json:"uid"`
		DeadlineMS int64  `json:"deadline_ms"`
		DueMS      int64  `json:"due_ms"`
		Stage      int    `json:"stage"`
	}
	if json.Unmarshal(b, &body) != nil || body.ID == "" {
		return 400
	}
	now := time.Now()
	if !strings.HasPrefix(body.UID, h.prefix) {
		return 200
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.posts++
	h.ids[body.ID]++
	if h.ids[body.ID] == 1 {
		h.users[body.UID+"/"+strconv.Itoa(body.Stage)]++
		h.last = now
		if body.Stage <= 1 {
			h.lags = append(h.lags, float64(now.UnixMilli()-body.DeadlineMS))
			h.firsts = append(h.firsts, now)
		} else {
			h.later = append(h.later, float64(now.UnixMilli()-body.DueMS))
		}
	}
	return 200
}

// distinct counts the stage 1 guides taken.
func (h *webhook) distinct() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.lags)
}

// laterLags are the later stages' lateness, ms from when each was due.
func (h *webhook) laterLags() []float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.later)
}

func (h *webhook) summary() (distinct, resent, doubled int, last time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range h.users {
		if n > 1 {
			doubled++
		}
	}
	return len(h.lags), h.posts - len(h.ids), doubled, h.last
}

func (h *webhook) guideLags() []float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lags)
}

// firstArrivals are the first posts' arrival times, one per guide id.
func (h *webhook) firstArrivals() []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.firsts)
}

// arrivedBefore counts the guide ids first posted before t.
func (h *webhook) arrivedBefore(t time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, at := range h.firsts {
		if at.Before(t) {
			n++
		}
	}
	return n
}
