package gateway

import (
	"hash/maphash"
	"sync"
	"time"
)

// hubShards spreads the registry's lock over many connections' comings and
// goings.
const hubShards = 64

// hub tracks which connections each user holds on this gateway. A user may
// hold several (phone and laptop); a guide goes to all of them. The hub
// also holds each user's place (see user.go): the connections being set
// up, counted against the per-user cap, and the renewals those
// connections share.
type hub struct {
	seed   maphash.Seed
	shards [hubShards]hubShard
}

type hubShard struct {
	mu sync.RWMutex
	// users is every user with a connection here, held or being set up;
	// a user's entry goes with their last.
	users map[string]*user
}

func newHub() *hub {
	h := &hub{seed: maphash.MakeSeed()}
	for i := range h.shards {
		h.shards[i].users = make(map[string]*user)
	}
	return h
}

func (h *hub) shard(uid string) *hubShard {
	return &h.shards[maphash.String(h.seed, uid)%hubShards]
}

// reserve holds a place for a connection of uid that is being set up,
// unless uid holds capacity connections here already, counting those
// being set up: the check and the count are one step, so that concurrent
// upgrades of one user cannot all pass it. The place is the connection's
// once add registers it; unreserve gives back one whose connection never
// came.
func (h *hub) reserve(uid string, capacity int) bool {
	s := h.shard(uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.users[uid]
	if u == nil {
		u = &user{conns: make(map[*conn]struct{}, 1)}
		s.users[uid] = u
	}
	if !admit(len(u.conns)+u.pending, capacity) {
		return false
	}
	u.pending++
	return true
}

// unreserve gives back a place reserve held, whose connection never came.
func (h *hub) unreserve(uid string) {
	s := h.shard(uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.users[uid]
	u.pending--
	s.forgetIfGone(uid, u)
}

// add registers c in the place reserve held for it, gives it its user's
// shared state, and times its registration (c.since) since start, under
// the shard's lock: a renewal c may share was made after c counted among
// the user's connections here, so that a session ended meanwhile on
// their last connection's normal close could not have left c out (see
// shareRenewal).
func (h *hub) add(c *conn, start time.Time) {
	s := h.shard(c.uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.users[c.uid]
	u.pending--
	u.conns[c] = struct{}{}
	c.user = u
	c.since = time.Since(start)
}

func (h *hub) remove(c *conn) {
	s := h.shard(c.uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.users[c.uid]
	if u == nil {
		return
	}
	delete(u.conns, c)
	s.forgetIfGone(c.uid, u)
}

// forgetIfGone drops u's entry once it holds no connection and none is
// being set up. The caller holds s.mu.
func (s *hubShard) forgetIfGone(uid string, u *user) {
	if len(u.conns) == 0 && u.pending == 0 {
		delete(s.users, uid)
	}
}

// lookup returns uid's connections.
func (h *hub) lookup(uid string) []*conn {
	s := h.shard(uid)
	s.mu.RLock()
	defer s.mu.RUnlock()
	u := s.users[uid]
	if u == nil {
		return []*conn{}
	}
	out := make([]*conn, 0, len(u.conns))
	for c := range u.conns {
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
	for _, u := range s.users {
		for c := range u.conns {
			out = append(out, c)
		}
	}
	return out
}

// all returns every connection, for the shutdown drain.
func (h *hub) all() []*conn {
	var out []*conn
	for i := range h.shards {
		out = append(out, h.shardConns(i)...)
	}
	return out
}

// count is how many connections uid holds here, those being set up not
// counted.
func (h *hub) count(uid string) int {
	s := h.shard(uid)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if u := s.users[uid]; u != nil {
		return len(u.conns)
	}
	return 0
}

// shardUIDs returns the users of one shard that hold a connection here.
func (h *hub) shardUIDs(i int) []string {
	s := &h.shards[i]
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.users))
	for uid, u := range s.users {
		if len(u.conns) > 0 {
			out = append(out, uid)
		}
	}
	return out
}
