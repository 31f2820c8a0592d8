package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// webhookSecret signs the consumer's posts; the webhook does not check
// it: it only counts.
const webhookSecret = "outagebench-webhook-secret-0123456789abcdef"

// webhook is the platform's side of the guides: it shows each user one
// guide per id, as the contract asks, and records every distinct guide
// per user with when it first arrived.
type webhook struct {
	srv *http.Server
	url string

	mu     sync.Mutex
	byID   map[string]bool
	byUser map[string][]shown
	posts  int
}

// shown is one distinct guide a user was shown.
type shown struct {
	id       string
	deadline time.Time // the session's deadline it is for, by Redis's clock
	at       time.Time // first arrival
}

func startWebhook() (*webhook, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &webhook{url: "http://" + ln.Addr().String() + "/guide", byID: map[string]bool{}, byUser: map[string][]shown{}}
	h.srv = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go h.srv.Serve(ln)
	return h, nil
}

func (h *webhook) close() { h.srv.Close() }

func (h *webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	var body struct {
		ID         string `json:"id"`
		UID        string `json:"uid"`
		DeadlineMS int64  `json:"deadline_ms"`
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil || json.Unmarshal(b, &body) != nil || body.ID == "" || body.UID == "" {
		http.Error(w, "bad guide", http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.posts++
	if !h.byID[body.ID] {
		h.byID[body.ID] = true
		h.byUser[body.UID] = append(h.byUser[body.UID], shown{id: body.ID, deadline: time.UnixMilli(body.DeadlineMS), at: at})
	}
	h.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// guides returns the distinct guides uid was shown, in arrival order.
func (h *webhook) guides(uid string) []shown {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]shown(nil), h.byUser[uid]...)
}

// counts returns the posts taken and the distinct guides among them.
func (h *webhook) counts() (posts, distinct int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.posts, len(h.byID)
}
