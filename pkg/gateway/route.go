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
	"github.com/stillthere/stillthere/pkg/userid"
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
// Every routeRefresh it marks all its users, a hub shard at a time spread
// over the period (all at once, on a gateway that took its connections
// together, would put every user's write in one burst before any new
// connect's, every period); and whenever this instance may have been
// forgotten (its channel resubscribed, its heartbeat came back, or found
// a gap in its leases) it marks them all at once. That keeps the route
// keys' TTL ahead while their connections live, and heals counts.
//
// A mark also carries whether the session is to end if no connection is
// left: the latest close of the user's connections here decides, as it
// would have had each close been written when it happened. A normal close
// whose write failed is not kept past a later close that was not normal
// (a reconnect that dropped while Redis was out of reach): that silence
// is the user's, and is guided.
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

// newInstanceID is the default instance id: the host name, or "gw" when
// it is not fit for one, plus a random suffix.
func newInstanceID() string {
	host, _ := os.Hostname()
	return instanceIDOf(host)
}

func instanceIDOf(host string) string {
	var b [4]byte
	rand.Read(b[:])
	id := host + "-" + hex.EncodeToString(b[:])
	if !validInstanceID(id) {
		id = "gw-" + hex.EncodeToString(b[:])
	}
	return id
}

// validInstanceID reports whether id may name a gateway instance: the
// characters of a user id (userid.Valid), which every value that holds
// an instance keeps whole. A "," would split the via of a session
// (session.viaFormat: the instance whose grant the deadline is, then the
// last to renew), and the outage rules would hold the user's deadline
// for an instance that does not exist instead of theirs.
func validInstanceID(id string) bool { return userid.Valid(id) }

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
	// close is the latest close of a connection of the user since the
	// last write: a normal close ends the session if no connection of
	// theirs is left anywhere, and Redis knows of no renewal since it.
	close   routeClose
	waiters []chan session.RouteResult
	// rounds are the re-registrations waiting for this write.
	rounds []*routeRound
}

// routeClose is what a mark says of a close: none (closeNone: a connect,
// or a refresh), or a connection of the user that ended at a time, since
// the gateway started: dropped (or cut off by the gateway), or closed
// normally (the client's 1000, or the gateway's 4000 after a close
// stage), the user leaving. The latest close decides whether the write
// ends the session, and a normal close's end is recorded at its time, so
// that one that waits out an outage here never overrides a ping the user
// made after it, on another instance (see session.RouteCount).
type routeClose struct {
	at     time.Duration // 0: no close
	normal bool
	// inactive: the normal close was the gateway's 4000 after a close
	// stage; a write it ends the session with counts a user closed for
	// inactivity.
	inactive bool
}

// closeNone marks a connect, or a refresh: no close.
var closeNone routeClose

// routeClose is what c's end says of the user's route: a normal close at
// its time, or a drop, which is known from release on.
func (c *conn) routeClose() routeClose {
	if c.normalClose() {
		return c.normalEnd()
	}
	return routeClose{at: max(time.Since(c.g.start), 1)}
}

// normalEnd is c's normal close. closedAt is stored before the grant goes
// to 0, so whoever sees the grant gone may call it.
func (c *conn) normalEnd() routeClose {
	return routeClose{at: max(c.endAt(), 1), normal: true, inactive: c.inactive()}
}

// note records a close, if it is the latest so far.
func (m *routeMark) note(c routeClose) {
	if c.at != 0 && c.at >= m.close.at {
		m.close = c
	}
}

// retried merges back a mark whose write failed into m, marked since.
func (m *routeMark) retried(old *routeMark) {
	m.note(old.close)
	m.rounds = append(m.rounds, old.rounds...)
}

// routeRound is one re-registration of every user: done runs once each
// user marked for it has been written.
type routeRound struct {
	left atomic.Int64
	done func()
}

func (r *routeRound) written() {
	if r.left.Add(-1) == 0 {
		r.done()
	}
}

func newRouteBook(g *Gateway) *routeBook {
	return &routeBook{g: g, kick: make(chan struct{}, 1), pending: make(map[string]*routeMark)}
}

// mark queues uid's count to be written, after close. done, if not nil,
// receives the write's result.
func (b *routeBook) mark(uid string, close routeClose, done chan session.RouteResult) {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		if done != nil {
			done <- session.RouteResult{Err: errRoutesStopped}
		}
		return
	}
	m := b.add(uid)
	m.note(close)
	if done != nil {
		m.waiters = append(m.waiters, done)
	}
	b.mu.Unlock()
	b.signal()
}

// add returns uid's pending mark, new if it had none; b.mu is held.
func (b *routeBook) add(uid string) *routeMark {
	m := b.pending[uid]
	if m == nil {
		m = &routeMark{}
		b.pending[uid] = m
	}
	return m
}

func (b *routeBook) signal() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// write marks uid and waits for its count to be written.
func (b *routeBook) write(ctx context.Context, uid string, close routeClose) error {
	return b.writeResult(ctx, uid, close).Err
}

// writeResult is write, with what the write found: the user's
// connections on every instance after it, and whether it ended the
// session.
func (b *routeBook) writeResult(ctx context.Context, uid string, close routeClose) session.RouteResult {
	done := make(chan session.RouteResult, 1)
	b.mark(uid, close, done)
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		return session.RouteResult{Err: ctx.Err()}
	}
}

// markAll marks every user this instance holds.
func (b *routeBook) markAll() { b.reregister(nil) }

// reregister marks every user this instance holds, and then, once each of
// them has been written, calls done (if not nil, and unless the writer
// stops first). A user who connects meanwhile registers with the connect.
func (b *routeBook) reregister(done func()) {
	var uids []string
	for shard := range hubShards {
		uids = append(uids, b.g.hub.shardUIDs(shard)...)
	}
	b.markUsers(uids, done)
}

// shardsDue is how many hub shards' slots in a refresh cycle have come
// by elapsed into it: a shard's slot is its share of the period.
func shardsDue(elapsed, period time.Duration) int {
	if period <= 0 || elapsed >= period {
		return hubShards
	}
	return min(int(elapsed*hubShards/period)+1, hubShards)
}

// nextCycle is when the refresh cycle after the one that began at cycle
// begins: a period later, or now if that is past already (a writer held
// for longer than a period starts afresh rather than catch up).
func nextCycle(cycle, now time.Time, period time.Duration) time.Time {
	if next := cycle.Add(period); next.After(now) {
		return next
	}
	return now
}

// markShard marks the users of one hub shard.
func (b *routeBook) markShard(shard int) { b.markUsers(b.g.hub.shardUIDs(shard), nil) }

// markUsers marks uids, and then, once each of them has been written,
// calls done (as reregister says).
func (b *routeBook) markUsers(uids []string, done func()) {
	var round *routeRound
	if done != nil {
		if len(uids) == 0 {
			done()
		} else {
			round = &routeRound{done: done}
			round.left.Store(int64(len(uids)))
		}
	}
	b.mu.Lock()
	if !b.stopped {
		for _, uid := range uids {
			m := b.add(uid)
			if round != nil {
				m.rounds = append(m.rounds, round)
			}
		}
	}
	b.mu.Unlock()
	b.signal()
}

// run writes marked users until ctx is done, then writes what is still
// marked once more, and refuses marks from then on.
func (b *routeBook) run(ctx context.Context) {
	period := b.g.cfg.routeRefresh()
	refresh := time.NewTicker(max(period/hubShards, time.Millisecond))
	defer refresh.Stop()
	cycle, next := time.Now(), 0 // the refresh cycle's start, and its next shard
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
					w <- session.RouteResult{Err: errRoutesStopped}
				}
			}
			b.pending = nil
			b.mu.Unlock()
			return
		case <-b.kick:
		case <-refresh.C:
			// By the time passed, not by ticks taken: a flush that held
			// the writer past ticks (dropped meanwhile) marks every shard
			// whose slot has come, so that a cycle never takes longer than
			// the period and a flush.
			due := shardsDue(time.Since(cycle), period)
			for ; next < due; next++ {
				b.markShard(next)
			}
			if next == hubShards {
				cycle, next = nextCycle(cycle, time.Now(), period), 0
			}
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
			end := marks[i].close
			counts[i] = session.RouteCount{UID: uid, Count: b.g.hub.count(uid), End: end.normal, EndAgo: now - end.at}
		}
		wctx, cancel := context.WithTimeout(ctx, routeWriteTimeout)
		res := b.g.store.WriteRoutes(wctx, b.g.instance, counts, b.g.cfg.routeTTL(), b.g.recentlyDead())
		cancel()
		failed := false
		var offers []string
		for i, r := range res {
			if r.Err == nil && r.Inbox && counts[i].Count > 0 && len(marks[i].waiters) == 0 {
				// A refresh found guides in the inbox of a user connected
				// here: one released or kept where no offer reached these
				// connections (by another instance, a lease run out, a
				// handover that stopped) waits no longer than this.
				offers = append(offers, uids[i])
			}
			if r.Err != nil {
				failed = true
				b.g.routeLog.Fail(r.Err)
				b.mu.Lock()
				if b.pending != nil {
					b.add(uids[i]).retried(marks[i])
				}
				b.mu.Unlock()
			} else {
				for _, round := range marks[i].rounds {
					round.written()
				}
			}
			if r.Ended {
				b.g.log.Debug("last connection closed normally: session ended", "uid", uids[i])
				if marks[i].close.inactive {
					// Counted here, where the close is applied, not when
					// its push is answered: a close stage pushed to a
					// connection holding its guides may be dropped as
					// superseded at its first ping (see present.go).
					metricClosedInactive.Inc()
				}
			}
			for _, w := range marks[i].waiters {
				w <- r
			}
		}
		if len(offers) > 0 && b.g.track(1) {
			go func() {
				defer b.g.conns.Done()
				for _, uid := range offers {
					b.g.offerInbox(context.WithoutCancel(ctx), uid)
				}
			}()
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

// redisNowMS estimates Redis's clock, Unix ms, from the last view of the
// instances (read every heartbeat), or this host's clock before the
// first.
func (g *Gateway) redisNowMS() int64 {
	if v := g.view.Load(); v != nil {
		return v.redisNow().UnixMilli()
	}
	return time.Now().UnixMilli()
}

// judgeDead decides whether an instance, as its heartbeat was read at
// read, is dead at now (both Redis's clock), and up to when its route
// entries are of the life that ended: those written before the read, if
// it was dead then, or else up to its lease's end. An instance that comes
// back beats first, with a gap, so anything it writes after is later than
// the cut of a judge that has not read that heartbeat yet.
func judgeDead(i session.Instance, read, now time.Time) (cut time.Time, dead bool) {
	if i.AliveAt(now) {
		return time.Time{}, false
	}
	end := i.Last.Add(i.Lease)
	if read.After(end) {
		// Dead at the read: its return, even in the read's millisecond,
		// was not seen; what it wrote in that millisecond may be new.
		return read.Add(-time.Millisecond), true
	}
	return end, true
}

// lateBeat reports whether i, alive at now by its lease, has missed a
// heartbeat: its last is more than half its lease (a beat and a half)
// old, and more than lateBeatMin. A process paused (SIGSTOP, a stalled
// VM) holds its connections' pings unread, and keeps them until it
// resumes or its lease runs out.
func lateBeat(i session.Instance, now time.Time) bool {
	return i.AliveAt(now) && now.Sub(i.Last) > max(i.Lease/2, lateBeatMin)
}

// lateBeatMin is how late a heartbeat may be before its instance counts as
// paused, whatever its lease: a busy host's heartbeats run late by less.
const lateBeatMin = time.Second

// deadInstance judges inst by the view: an instance the view does not
// know is not judged dead, it may have started since.
func (g *Gateway) deadInstance(inst string) (session.DeadInstance, bool) {
	v := g.view.Load()
	if v == nil {
		return session.DeadInstance{}, false
	}
	i, ok := v.instances[inst]
	if !ok {
		return session.DeadInstance{}, false
	}
	cut, dead := judgeDead(i, v.now, v.redisNow())
	return session.DeadInstance{Name: inst, Cut: cut}, dead
}

// instanceDead reports whether inst is dead by its heartbeat: its lease
// ran out, or it left.
func (g *Gateway) instanceDead(inst string) bool {
	_, dead := g.deadInstance(inst)
	return dead
}

// recentlyDead lists the instances dead for less than twice the route
// TTL: their entries may still be in route keys that live instances
// refresh. Those dead longer were dropped by such a refresh, or their
// keys ran out.
func (g *Gateway) recentlyDead() []session.DeadInstance {
	v := g.view.Load()
	if v == nil {
		return nil
	}
	now := v.redisNow()
	var out []session.DeadInstance
	for name, i := range v.instances {
		if name == g.instance || now.Sub(i.Last.Add(i.Lease)) >= 2*g.cfg.routeTTL() {
			continue
		}
		if cut, dead := judgeDead(i, v.now, now); dead {
			out = append(out, session.DeadInstance{Name: name, Cut: cut})
		}
	}
	return out
}

// viewPtr holds the instance view; a type of its own so the Gateway
// struct reads plainly.
type viewPtr = atomic.Pointer[instanceView]
