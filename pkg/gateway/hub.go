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
// connections share. A user's connections are a list through each
// connection's next, not a map of their own: most users hold one, and
// none holds more than max-user-conns.
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
		u = &user{}
		s.users[uid] = u
	}
	if !admit(u.count()+u.pending, capacity) {
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

// add registers c in the place reserve held for it (whose shared state
// c finds by its uid, see userOf), and times its registration since
// start (in c.pingAt, until its first ping; see renew), under
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
	c.next, u.conns = u.conns, c
	now := int64(time.Since(start))
	c.pingAt.Store(now)
	c.heard.Store(now)
}

func (h *hub) remove(c *conn) {
	s := h.shard(c.uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.users[c.uid]
	if u == nil {
		return
	}
	for at := &u.conns; *at != nil; at = &(*at).next {
		if *at == c {
			*at, c.next = c.next, nil
			break
		}
	}
	s.forgetIfGone(c.uid, u)
}

// count is how many connections u holds here. The caller holds the
// shard's lock.
func (u *user) count() int {
	n := 0
	for c := u.conns; c != nil; c = c.next {
		n++
	}
	return n
}

// forgetIfGone drops u's entry once it holds no connection and none is
// being set up. The caller holds s.mu.
func (s *hubShard) forgetIfGone(uid string, u *user) {
	if u.conns == nil && u.pending == 0 {
		delete(s.users, uid)
	}
}

// userOf returns the place of uid, which holds a connection here (it
// stays as long as one does), and the lock that guards it.
func (h *hub) userOf(uid string) (*user, sync.Locker) {
	s := h.shard(uid)
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.users[uid], &s.mu
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
	out := make([]*conn, 0, u.count())
	for c := u.conns; c != nil; c = c.next {
		out = append(out, c)
	}
	return out
}

// appendShard appends to dst the connections of shard i that keep
// accepts (nil: every one), and returns it.
func (h *hub) appendShard(dst []*conn, i int, keep func(*conn) bool) []*conn {
	s := &h.shards[i]
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, u := range s.users {
		for c := u.conns; c != nil; c = c.next {
			if keep == nil || keep(c) {
				dst = append(dst, c)
			}
		}
	}
	return dst
}

// all returns every connection, for the shutdown drain.
func (h *hub) all() []*conn {
	var out []*conn
	for i := range h.shards {
		out = h.appendShard(out, i, nil)
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
		return u.count()
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
		if u.conns != nil {
			out = append(out, uid)
		}
	}
	return out
}
