package main

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Relay modes: how the relay on a consumer's push path treats each push.
const (
	relayForward   int32 = iota
	relayDuplicate       // each push sent twice, the second while the first may be in flight
	relayReorder         // each push held a random moment, so later ones overtake it
)

// reorderMax bounds how long the relay holds a push when reordering.
const reorderMax = 1500 * time.Millisecond

// relay is an HTTP relay on a consumer's push path (consumer, relay,
// the gateway's internal listener through its TCP proxy), which can
// duplicate or reorder pushes, as a retrying load balancer or a network
// that delivers out of order would.
type relay struct {
	target string // host:port
	srv    *http.Server
	addr   string
	client *http.Client
	mode   atomic.Int32

	mu  sync.Mutex
	rnd *rand.Rand // the delays; seeded, though the interleaving is the machine's
}

func startRelay(target string, seed uint64) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{target: target, addr: ln.Addr().String(),
		client: &http.Client{Timeout: 10 * time.Second},
		rnd:    rand.New(rand.NewPCG(seed, 0x7e1a))}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

func (r *relay) close() { r.srv.Close() }

func (r *relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		http.Error(w, "relay: read", http.StatusBadGateway)
		return
	}
	switch r.mode.Load() {
	case relayReorder:
		r.mu.Lock()
		d := time.Duration(r.rnd.Int64N(int64(reorderMax)))
		r.mu.Unlock()
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-req.Context().Done():
			t.Stop()
			return
		}
	case relayDuplicate:
		// The copy goes first and its answer is dropped: the consumer
		// sees the answer to its own.
		go func() {
			if resp, err := r.forward(req, body); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	resp, err := r.forward(req, body)
	if err != nil {
		http.Error(w, "relay: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

func (r *relay) forward(req *http.Request, body []byte) (*http.Response, error) {
	out, err := http.NewRequest(req.Method, "http://"+r.target+req.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = req.Header.Clone()
	return r.client.Do(out)
}
