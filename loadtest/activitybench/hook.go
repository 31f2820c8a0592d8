package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/webhook"
)

// hookSecret signs the consumer's posts. The webhook does not check it:
// it only records.
const hookSecret = "activitybench-webhook-secret-0123456789abcdef"

// hook is the platform's guide webhook: it shows each guide id once, as
// the contract asks, and records each user's distinct first-stage guides
// with when each first arrived. Later stages are counted apart.
type hook struct {
	srv *http.Server
	url string

	mu     sync.Mutex
	seen   map[string]bool
	byUser map[string][]arrival
	posts  int
	later  int // distinct guides of a later stage
}

func startHook() (*hook, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hook{url: "http://" + ln.Addr().String() + "/guides", seen: map[string]bool{}, byUser: map[string][]arrival{}}
	h.srv = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go h.srv.Serve(ln)
	return h, nil
}

func (h *hook) close() { h.srv.Close() }

func (h *hook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	var g webhook.Body
	b, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil || json.Unmarshal(b, &g) != nil || g.ID == "" || g.UID == "" {
		http.Error(w, "bad guide", http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.posts++
	if h.seen[g.ID] {
		return // 200: shown once already
	}
	h.seen[g.ID] = true
	if g.Stage > 1 {
		h.later++
		return
	}
	h.byUser[g.UID] = append(h.byUser[g.UID], arrival{id: g.ID, deadline: time.UnixMilli(g.DeadlineMS), at: at})
}

// guided reports whether uid has had a first-stage guide.
func (h *hook) guided(uid string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byUser[uid]) > 0
}

// guides returns a copy of every user's distinct first-stage guides.
func (h *hook) guides() map[string][]arrival {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string][]arrival, len(h.byUser))
	for uid, gs := range h.byUser {
		out[uid] = append([]arrival(nil), gs...)
	}
	return out
}

// counts returns the posts taken, and the later-stage guides among the
// distinct ones.
func (h *hook) counts() (posts, later int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.posts, h.later
}
