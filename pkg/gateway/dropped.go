package gateway

import (
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// dropped remembers the last grant of connections that ended without a
// normal close, until the grant runs out: their sessions are left to run
// out in Redis, and if Redis loses them meanwhile (a restart without its
// data), a resync writes them back, so that those users still get their
// guide. One entry per user, the latest; a user who reconnects is
// restored from the live connection too, and resync keeps the later
// deadline.
type dropped struct {
	mu     sync.Mutex
	grants map[string]droppedGrant // by uid
}

type droppedGrant struct {
	segment string
	pingAt  time.Duration // since the gateway started
	ttl     time.Duration
}

func newDropped() *dropped { return &dropped{grants: map[string]droppedGrant{}} }

// add remembers c's last grant, if it has one.
func (d *dropped) add(c *conn) {
	ttl := time.Duration(c.grant.Load())
	if ttl == 0 {
		return // never pinged, or ended by a normal close
	}
	g := droppedGrant{segment: c.segment, pingAt: time.Duration(c.pingAt.Load()), ttl: ttl.Abs()}
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.grants[c.uid]; !ok || old.pingAt+old.ttl < g.pingAt+g.ttl {
		d.grants[c.uid] = g
	}
}

// left returns the grants with time left at now (since the gateway
// started), and forgets those that ran out.
func (d *dropped) left(now time.Duration) []session.Grant {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]session.Grant, 0, len(d.grants))
	for uid, g := range d.grants {
		left := g.ttl - (now - g.pingAt)
		if left <= 0 {
			delete(d.grants, uid)
			continue
		}
		out = append(out, session.Grant{UID: uid, Segment: g.segment, Left: left, Ago: now - g.pingAt})
	}
	return out
}
