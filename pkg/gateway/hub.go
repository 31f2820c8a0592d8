package gateway

import (
	"hash/maphash"
	"sync"
)

// hubShards spreads the registry's lock over many connections' comings and
// goings.
const hubShards = 64

// hub tracks which connections each user holds on this gateway. A user may
// hold several (phone and laptop); a guide goes to all of them.
type hub struct {
	seed   maphash.Seed
	shards [hubShards]hubShard
}

type hubShard struct {
	mu    sync.RWMutex
	conns map[string]map[*conn]struct{}
}

func newHub() *hub {
	h := &hub{seed: maphash.MakeSeed()}
	for i := range h.shards {
		h.shards[i].conns = make(map[string]map[*conn]struct{})
	}
	return h
}

func (h *hub) shard(uid string) *hubShard {
	return &h.shards[maphash.String(h.seed, uid)%hubShards]
}

func (h *hub) add(c *conn) {
	s := h.shard(c.uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.conns[c.uid]
	if set == nil {
		set = make(map[*conn]struct{}, 1)
		s.conns[c.uid] = set
	}
	set[c] = struct{}{}
}

func (h *hub) remove(c *conn) {
	s := h.shard(c.uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.conns[c.uid]
	delete(set, c)
	if len(set) == 0 {
		delete(s.conns, c.uid)
	}
}

// lookup returns uid's connections.
func (h *hub) lookup(uid string) []*conn {
	s := h.shard(uid)
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*conn, 0, len(s.conns[uid]))
	for c := range s.conns[uid] {
		out = append(out, c)
	}
	return out
}

// shardConns returns the connections of one shard.
func (h *hub) shardConns(i int) []*conn {
	s := &h.shards[i]
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*conn
	for _, set := range s.conns {
		for c := range set {
			out = append(out, c)
		}
	}
	return out
}

// all returns every connection, for the shutdown drain.
func (h *hub) all() []*conn {
	var out []*conn
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.RLock()
		for _, set := range s.conns {
			for c := range set {
				out = append(out, c)
			}
		}
		s.mu.RUnlock()
	}
	return out
}

// count is how many connections uid holds here.
func (h *hub) count(uid string) int {
	s := h.shard(uid)
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.conns[uid])
}

// shardUIDs returns the users of one shard.
func (h *hub) shardUIDs(i int) []string {
	s := &h.shards[i]
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.conns))
	for uid := range s.conns {
		out = append(out, uid)
	}
	return out
}
