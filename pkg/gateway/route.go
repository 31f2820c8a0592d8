package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// Route keys say which gateway instances hold a user's connections, and
// so where a guide goes and whether a normal close was the user's last
// connection (session.Store.WriteRoutes). This instance keeps its entries
// equal to its hub through one writer, routeBook: a connection that comes
// or goes marks its user, and the writer writes the user's absolute count,
// read from the hub when it writes, batched and pipelined. With one
// writer the writes of one user never overtake each other, and a write
// that failed, or one that Redis lost, is healed by the next.
//
// Every routeRefresh, and whenever this instance may have been forgotten
// (its channel resubscribed, its heartbeat came back), it marks all its
// users: that keeps the route keys' TTL ahead while their connections
// live, and heals counts.
//
// The channels are sharded (SSUBSCRIBE/SPUBLISH): in a Redis Cluster a
// shard channel lives on one master, and SPUBLISH counts its subscribers
// exactly, where a classic PUBLISH counts only those on the node it hit.

const (
	// defaultRouteRefresh is how often every route entry of this
	// instance is written again.
	defaultRouteRefresh = time.Minute
	// defaultRouteTTL is the route keys' TTL, refreshed by every write:
	// ten refreshes missed, and the key of a user nobody holds any more
	// goes.
	defaultRouteTTL = 10 * time.Minute
	// routeBatch is the most users written in one round trip.
	routeBatch = 512
	// routeRetry is the pause after a failed write before the next.
	routeRetry = time.Second
	// routeWriteTimeout bounds a connection's wait for its route write.
	routeWriteTimeout = 5 * time.Second
)

var errRoutesStopped = errors.New("route writer stopped")

func newInstanceID() string {
	host, _ := os.Hostname()
	var b [4]byte
	rand.Read(b[:])
	if host == "" {
		host = "gw"
	}
	return host + "-" + hex.EncodeToString(b[:])
}

// routeBook is this instance's one writer of route entries.
type routeBook struct {
	g    *Gateway
	kick chan struct{}

	mu      sync.Mutex
	pending map[string]*routeMark
	stopped bool
}

// routeMark is a user whose count is to be written.
type routeMark struct {
	// endAt, when not zero, is when a connection of the user last closed
	// normally, since the gateway started (never zero in practice): the
	// session ends if no connection of theirs is left anywhere, and Redis
	// knows of no renewal since. Written with its time, an end that waits
	// out an outage here never overrides a ping the user made after it,
	// on another instance (see session.RouteCount).
	endAt   time.Duration
	waiters []chan error
}

func newRouteBook(g *Gateway) *routeBook {
	return &routeBook{g: g, kick: make(chan struct{}, 1), pending: make(map[string]*routeMark)}
}

// mark queues uid's count to be written, with the time of a normal close
// to end the session at (endAt, zero for none). done, if not nil,
// receives the write's result.
func (b *routeBook) mark(uid string, endAt time.Duration, done chan error) {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		if done != nil {
			done <- errRoutesStopped
		}
		return
	}
	b.add(uid, endAt, done)
	b.mu.Unlock()
	b.signal()
}

// add is mark's bookkeeping; b.mu is held.
func (b *routeBook) add(uid string, endAt time.Duration, done chan error) {
	m := b.pending[uid]
	if m == nil {
		m = &routeMark{}
		b.pending[uid] = m
	}
	m.endAt = max(m.endAt, endAt)
	if done != nil {
		m.waiters = append(m.waiters, done)
	}
}

func (b *routeBook) signal() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// write marks uid and waits for its count to be written.
func (b *routeBook) write(ctx context.Context, uid string, endAt time.Duration) error {
	done := make(chan error, 1)
	b.mark(uid, endAt, done)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// markAll marks every user this instance holds.
func (b *routeBook) markAll() {
	for shard := range hubShards {
		uids := b.g.hub.shardUIDs(shard)
		b.mu.Lock()
		if !b.stopped {
			for _, uid := range uids {
				b.add(uid, 0, nil)
			}
		}
		b.mu.Unlock()
	}
	b.signal()
}

// run writes marked users until ctx is done, then writes what is still
// marked once more, and refuses marks from then on.
func (b *routeBook) run(ctx context.Context) {
	refresh := time.NewTicker(b.g.cfg.routeRefresh())
	defer refresh.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			b.mu.Lock()
			b.stopped = true
			b.mu.Unlock()
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), routeWriteTimeout)
			b.flush(fctx)
			cancel()
			b.mu.Lock()
			for _, m := range b.pending {
				for _, w := range m.waiters {
					w <- errRoutesStopped
				}
			}
			b.pending = nil
			b.mu.Unlock()
			return
		case <-b.kick:
		case <-refresh.C:
			b.markAll()
		case <-retry.C:
		}
		if !b.flush(ctx) {
			retry.Reset(routeRetry)
		}
	}
}

// flush writes every marked user, a batch per round trip, and reports
// whether all writes succeeded. A failed user stays marked for the next.
func (b *routeBook) flush(ctx context.Context) bool {
	for {
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.mu.Unlock()
			return true
		}
		uids := make([]string, 0, min(len(b.pending), routeBatch))
		marks := make([]*routeMark, 0, cap(uids))
		for uid, m := range b.pending {
			uids, marks = append(uids, uid), append(marks, m)
			delete(b.pending, uid)
			if len(uids) == routeBatch {
				break
			}
		}
		b.mu.Unlock()

		// Counts are read now, after the marks were taken: a connection
		// that comes or goes from here on marks its user again.
		counts := make([]session.RouteCount, len(uids))
		now := time.Since(b.g.start)
		for i, uid := range uids {
			end := marks[i].endAt
			counts[i] = session.RouteCount{UID: uid, Count: b.g.hub.count(uid), End: end != 0, EndAgo: now - end}
		}
		wctx, cancel := context.WithTimeout(ctx, routeWriteTimeout)
		res := b.g.store.WriteRoutes(wctx, b.g.instance, counts, b.g.cfg.routeTTL(), b.g.recentlyDead())
		cancel()
		failed := false
		for i, r := range res {
			if r.Err != nil {
				failed = true
				b.g.routeLog.Fail(r.Err)
				b.mu.Lock()
				if b.pending != nil {
					b.add(uids[i], marks[i].endAt, nil)
				}
				b.mu.Unlock()
			}
			if r.Ended {
				b.g.log.Debug("last connection closed normally: session ended", "uid", uids[i])
			}
			for _, w := range marks[i].waiters {
				w <- r.Err
			}
		}
		if failed {
			return false
		}
		b.g.routeLog.OK()
	}
}

// instanceView is the gateway instances' heartbeats as last read, every
// heartbeat.
type instanceView struct {
	now       time.Time // Redis's clock when read
	at        time.Time // this host's clock then (monotonic)
	instances map[string]session.Instance
}

// readInstances refreshes the view of the instances' heartbeats.
func (g *Gateway) readInstances(ctx context.Context) {
	now, inst, err := g.ctl.Instances(ctx)
	if err != nil {
		g.routeLog.Fail(err)
		return
	}
	g.view.Store(&instanceView{now: now, at: time.Now(), instances: inst})
}

// redisNow estimates Redis's clock from the view.
func (v *instanceView) redisNow() time.Time { return v.now.Add(time.Since(v.at)) }

// instanceDead reports whether inst is dead by its heartbeat: its lease
// ran out, or it left. An instance the view does not know is not judged
// dead: it may have started since.
func (g *Gateway) instanceDead(inst string) bool {
	v := g.view.Load()
	if v == nil {
		return false
	}
	i, ok := v.instances[inst]
	return ok && !i.AliveAt(v.redisNow())
}

// recentlyDead lists the instances dead for less than twice the route
// TTL: their entries may still be in route keys that live instances
// refresh. Those dead longer were dropped by such a refresh, or their
// keys ran out.
func (g *Gateway) recentlyDead() []string {
	v := g.view.Load()
	if v == nil {
		return nil
	}
	now := v.redisNow()
	var out []string
	for name, i := range v.instances {
		if name != g.instance && !i.AliveAt(now) && now.Sub(i.Last.Add(i.Lease)) < 2*g.cfg.routeTTL() {
			out = append(out, name)
		}
	}
	return out
}

// viewPtr holds the instance view; a type of its own so the Gateway
// struct reads plainly.
type viewPtr = atomic.Pointer[instanceView]
