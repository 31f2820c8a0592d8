package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/session"
)

// A silence we caused is not a silence. While this gateway cannot reach
// Redis, its users' pings renew nothing, and their deadlines in the index
// run out although they are there. So the gateway
//
//   - heartbeats: every heartbeat-interval it tells Redis it is alive,
//     for a lease of three intervals; the heartbeat script records a gap
//     in them as a blind interval of this instance, and Leave marks the
//     instance gone when it stops;
//   - reports its own renewal outages: once renewals succeed again after
//     failing, it records how long they failed as a blind interval of
//     this instance (session.BlindRenewals), first; and while they fail
//     and Redis still takes its heartbeats (a partial outage: a cluster
//     slot migrating for longer than renewals are retried, a master
//     failing over while the control keys' one answers), it records the
//     outage so far every second, so that a listener that meets a
//     lapsed deadline the moment its slot is back finds the outage
//     already recorded. A round trip that hangs is such an outage from
//     the moment it has held its renewals for longer than a heartbeat
//     interval (see stallAfter), not only once it returns: renewals go
//     one round trip at a time, so one that waits on a cluster master
//     that stopped or died holds every renewal of this instance, and
//     the deadlines they were to extend lapse while it waits;
//   - resyncs: then, and after a heartbeat gap, it writes every
//     connection's last grant again, as far as it is left: the deadline
//     its last ping was given, or would have been. A resync never moves a
//     deadline past that, and never shortens one written since. A grant
//     that ran out in the outage (at or after its start: see lapseFrom)
//     is handed over too, as lapsed: its silence fell in the outage, and
//     Redis may have lost it, or never had it. Redis restores it at
//     its own deadline (due at once), held by the listener until the
//     grace is over, only if that silence cannot have been guided
//     already (see session.Renewer.Resync). One that ran out before the
//     outage is not: it was Redis's to guide (a user silent for hours whose
//     connection stays open), and a restore would guide it again.
//
// The expiry listener reads the blind intervals and the instances'
// heartbeats, and does not count such time toward a user's silence.

const (
	// resyncBatch is the grants handed to the renewer at once.
	resyncBatch = 4096
	// resyncRetry is the pause before a resync that failed is tried again.
	resyncRetry = time.Second
	// leaveTimeout bounds Leave on shutdown.
	leaveTimeout = 2 * time.Second
	// slowFlush is the longest a renewal round trip may hold its
	// renewals before it counts as an outage: renewals held up in the
	// client's retries (a cluster failover) land after the deadlines they
	// were to extend. A shorter heartbeat interval shortens it (see
	// stallAfter).
	slowFlush = time.Second
	// stallFloor is the shortest: a busy host's ordinary round trips take
	// a tenth of a second now and then, and are no outage.
	stallFloor = 250 * time.Millisecond
	// flushFailFresh is how long a failed renewal round trip stands for
	// the renewals' state when none follows it. While clients ping,
	// failed round trips follow each other much closer than this (one
	// takes at most its 5s timeout).
	flushFailFresh = 10 * time.Second
	// ongoingRecordEvery is how often an outage that lasts is recorded
	// again, each record replacing the last: far inside any grace.
	ongoingRecordEvery = time.Second
)

// stallAfter is how long a renewal round trip may hold its renewals
// before it counts as an outage: a heartbeat interval, within [stallFloor,
// slowFlush]. The listener takes an instance whose heartbeat is that late
// for dead, and operators keep the clients' margin (the shortest TTL less
// their ping period) above PingMargin; so a round trip that hangs is
// recorded, like a missed heartbeat, before the first deadline it holds
// up lapses.
func stallAfter(heartbeat time.Duration) time.Duration {
	return min(slowFlush, max(heartbeat, stallFloor))
}

// PingMargin is the least time before their deadline that clients must
// ping for the promise to hold when their gateway instance, heartbeating
// every heartbeat, dies or is cut from Redis just after their ping came,
// its renewal not yet written. The listener holds a dead instance's users
// from the moment it finds a heartbeat missed, at most an interval and
// session.BeatSlack after the last one; until then the instance looks
// alive and a deadline is judged as any. A renewal that waits longer than
// stallAfter is recorded as the instance's outage before the next
// heartbeat is sent (see beat), so only a wait shorter than that, and
// the time that heartbeat takes to land, is lost with the process: a
// quarter of stallAfter is allowed for it. A client whose ping period is
// shorter than the shortest TTL less this margin is safe: with the
// defaults (1 s) 2.5 s, within the lease of three intervals; at
// intervals under stallFloor the margin exceeds the lease.
func PingMargin(heartbeat time.Duration) time.Duration {
	stall := stallAfter(heartbeat)
	return heartbeat + session.BeatSlack + stall + stall/4
}

// reach is what the gateway knows of its own reach to Redis. The renewer's
// OnFlush (on the renewer's goroutine), the record loop and the heartbeat
// loop write it; readyz and the resync loop read it.
type reach struct {
	queued time.Duration // the longest a renewal waits for its round trip
	slow   time.Duration // how long a round trip may take before it counts as an outage
	// waiting is when the oldest renewal of the round trip in flight was
	// queued, zero between round trips (the renewer's Waiting); nil
	// watches nothing.
	waiting func() time.Time

	mu         sync.Mutex
	flushFail  time.Time // start of the current failure of renewal round trips; zero while they succeed
	answered   time.Time // end of the latest renewal round trip that succeeded, however late
	lastFail   time.Time // end of the latest failed round trip
	blindSince time.Time // start of failed round trips not recorded as a blind interval yet
	beatFail   time.Time // first failed heartbeat of the current failure; zero while they succeed
	// failures counts what may have left grants unwritten: failed round
	// trips and heartbeats, a loss of Redis's data. A round trip that was
	// only late wrote its renewals, and those behind it are still queued:
	// it owes a record of the outage (blindSince), not a resync.
	failures uint64
	// synced is the failures a completed resync followed.
	synced uint64
	// unregSince: since when this instance's users are being registered
	// again in their routes (others may have dropped them), zero once
	// done; rounds counts the registrations begun.
	unregSince time.Time
	rounds     uint64
	// lapseFrom is the start of the failures no completed resync has
	// followed yet, zero when there are none: the resync hands over the
	// grants that ran out since (see resynced).
	lapseFrom time.Time

	// kick wakes the resync loop: something healed, a resync may be owed.
	kick chan struct{}
	// failed wakes the record loop: renewals fail, the outage so far may
	// be recorded while it lasts.
	failed chan struct{}
}

func newReach(queued, slow time.Duration, waiting func() time.Time) *reach {
	return &reach{queued: queued, slow: slow, waiting: waiting, kick: make(chan struct{}, 1), failed: make(chan struct{}, 1)}
}

func (r *reach) signal() { wake(r.kick) }

// wake signals c unless a signal is pending already.
func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// flushed observes one renewal round trip. It runs on the renewer's
// goroutine, between round trips: it only updates state and kicks.
func (r *reach) flushed(took time.Duration, err error) {
	now := time.Now()
	r.mu.Lock()
	if err != nil {
		// The renewals in it came up to a flush interval before it began.
		start := now.Add(-took - r.queued)
		if r.flushFail.IsZero() {
			r.flushFail = start
		}
		if r.blindSince.IsZero() {
			r.blindSince = start
		}
		r.lapsed(start)
		r.lastFail = now
		r.failures++
		r.mu.Unlock()
		wake(r.failed)
		return
	}
	healed := !r.flushFail.IsZero()
	r.flushFail = time.Time{}
	r.answered = now
	if took > r.slow {
		// Written, but late: record it. Nothing was lost, so nothing is
		// resynced: a resync is a renewal of every connection, and one
		// after each late round trip of a busy Redis made it busier.
		if r.blindSince.IsZero() {
			r.blindSince = now.Add(-took - r.queued)
		}
		r.lapsed(now.Add(-took - r.queued))
		r.lastFail = now
		healed = true
	}
	r.mu.Unlock()
	if healed {
		r.signal()
	}
}

// dropped observes a renewal that failed for want of room in the queue,
// queued at queued: its grant was never written, as a failed round trip's
// were not, and a resync is owed, as after one (the outage from then on is
// recorded). Not a cut-off: the round trips go on.
func (r *reach) dropped(queued time.Time) {
	r.mu.Lock()
	if r.blindSince.IsZero() || queued.Before(r.blindSince) {
		r.blindSince = queued
	}
	r.lapsed(queued)
	r.lastFail = time.Now()
	r.failures++
	r.mu.Unlock()
	wake(r.failed)
	r.signal()
}

// watch looks at the round trip in flight, and if it has held its renewals
// for longer than slow, notes that renewals fail since the oldest was
// queued, as a failed round trip would, and reports true: they fail until
// it returns, whatever it returns, and the outage so far is to be recorded
// while it lasts. flushed ends that failure once the round trip returns,
// and counts it toward a resync only if it failed.
func (r *reach) watch() bool {
	if r.waiting == nil {
		return false
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	// Read under mu: the renewer ends a round trip before it calls
	// flushed, which takes mu; so a round trip seen in flight here has
	// its flushed still to come, and the failure noted here is not left
	// standing after it.
	since := r.waiting()
	if since.IsZero() || now.Sub(since) <= r.slow {
		return false
	}
	if r.flushFail.IsZero() {
		r.flushFail = since
	}
	if r.blindSince.IsZero() {
		r.blindSince = since
	}
	r.lapsed(since)
	r.lastFail = now
	return true
}

// lapsed notes that Redis may have been out of reach since t. r.mu is held.
func (r *reach) lapsed(t time.Time) {
	if r.lapseFrom.IsZero() || t.Before(r.lapseFrom) {
		r.lapseFrom = t
	}
}

// lostSince notes that Redis may have been out of reach, or lost its
// data, since t: a resync is to hand over the grants that ran out since.
// A heartbeat's failure or loss reports when that heartbeat was sent (see
// beat for why not the last one that got through).
func (r *reach) lostSince(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lapsed(t)
}

// outage is the start of the failures no completed resync has followed
// (zero if none), and the failures so far, for resynced.
func (r *reach) outage() (from time.Time, failures uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lapseFrom, r.failures
}

// resyncOwed reports whether Redis may have missed grants that no
// completed resync has written back since (failures a resync has not
// followed, or an outage's start not forgotten): a connection's ping
// whose renewal was not written may be newer than anything Redis knows of
// its user.
func (r *reach) resyncOwed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures != r.synced || !r.lapseFrom.IsZero()
}

// resynced notes that a resync after failures completed: their start is
// forgotten, unless one failed since it began.
func (r *reach) resynced(failures uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.synced = max(r.synced, failures)
	if r.failures == failures {
		r.lapseFrom = time.Time{}
	}
}

// cutOffSince is since when Redis has been out of this instance's reach,
// or zero: see cutOff.
func (r *reach) cutOffSince() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return cutOff(r.flushFail, r.answered, r.beatFail)
}

// cutOff decides since when Redis is out of reach, from when renewals
// started to fail (or to be held up), when a renewal round trip last
// succeeded, and when heartbeats started to fail; zero while it is at
// hand. An answer is the evidence: renewals held up behind a busy Redis
// fail for the listener (it holds their users), but a round trip that
// succeeded since shows Redis at hand, and the time they waited in this
// instance's own queue is no outage. Closing every connection for it
// (shedIfCutOff) sent clients to reconnect all at once, to gateways busy
// with the same Redis.
func cutOff(flushFail, answered, beatFail time.Time) time.Time {
	renew := flushFail
	if !renew.IsZero() && answered.After(renew) {
		renew = answered
	}
	switch {
	case renew.IsZero():
		return beatFail
	case beatFail.IsZero() || renew.Before(beatFail):
		return renew
	}
	return beatFail
}

// shedDue decides whether a gateway that has not shed yet in this outage
// closes every connection now: Redis out of reach since since, for
// shedAfter (0: never).
func shedDue(since, now time.Time, shedAfter time.Duration) bool {
	return !since.IsZero() && shedAfter > 0 && now.Sub(since) >= shedAfter
}

// staleFlushFail reports whether renewals failed and none has run for
// flushFailFresh: whether they still would is unknown.
func (r *reach) staleFlushFail() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.flushFail.IsZero() && time.Since(r.lastFail) > flushFailFresh
}

// beaten observes one heartbeat, and with sharedOK whether the shared
// pool, the renewals' way to Redis, answered a check (true when none was
// needed).
func (r *reach) beaten(err error, sharedOK bool) {
	now := time.Now()
	r.mu.Lock()
	if err != nil {
		if r.beatFail.IsZero() {
			r.beatFail = now
		}
		r.failures++
		r.mu.Unlock()
		return
	}
	healed := !r.beatFail.IsZero()
	r.beatFail = time.Time{}
	// Renewals that failed and were never followed by one that succeeded,
	// as when every client went quiet during the outage: the outage is
	// over once the shared pool answers too. The heartbeat's answer alone
	// does not say so: it has a connection of its own.
	if sharedOK && !r.flushFail.IsZero() && now.Sub(r.lastFail) > flushFailFresh {
		r.flushFail = time.Time{}
		healed = true
	}
	r.mu.Unlock()
	if healed {
		r.signal()
	}
}

// owed notes that a resync is owed although nothing failed: Redis lost
// its data, or others took this instance for dead.
func (r *reach) owed() {
	r.mu.Lock()
	r.failures++
	r.mu.Unlock()
	r.signal()
}

// unregistered notes that this instance's users are to be registered
// again in their routes, and returns the round for registered.
func (r *reach) unregistered() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rounds++
	if r.unregSince.IsZero() {
		r.unregSince = time.Now()
	}
	return r.rounds
}

// registered notes that every user is registered again, as of round: a
// later round still owed keeps the instance unready.
func (r *reach) registered(round uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if round == r.rounds {
		r.unregSince = time.Time{}
	}
}

// failureCount is the failed round trips and heartbeats so far.
func (r *reach) failureCount() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures
}

// partial reports whether renewals are failing while heartbeats get
// through: Redis takes a record of the outage while it lasts.
func (r *reach) partial() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.flushFail.IsZero() && r.beatFail.IsZero()
}

// unrecorded is the start of renewal failures not yet recorded as a blind
// interval, or zero.
func (r *reach) unrecorded() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blindSince
}

// recorded notes that renewal failures up to at are recorded. If one
// failed since, the rest of its time is still owed.
func (r *reach) recorded(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastFail.After(at) {
		r.blindSince = at
	} else {
		r.blindSince = time.Time{}
	}
}

// err says what fails, for readyz.
func (r *reach) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.beatFail.IsZero():
		return fmt.Errorf("heartbeats failing since %s", r.beatFail.UTC().Format(time.RFC3339))
	case !r.flushFail.IsZero():
		return fmt.Errorf("session renewals failing since %s", r.flushFail.UTC().Format(time.RFC3339))
	case !r.unregSince.IsZero():
		return fmt.Errorf("registering users in their routes again since %s", r.unregSince.UTC().Format(time.RFC3339))
	}
	return nil
}

// lease is how long one heartbeat keeps this instance alive.
func (g *Gateway) lease() time.Duration { return 3 * g.cfg.HeartbeatInterval }

// heartbeat beats every heartbeat-interval until ctx is done.
func (g *Gateway) heartbeat(ctx context.Context) {
	t := time.NewTicker(g.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.beat(ctx)
	}
}

// beat tells Redis this instance is alive for one lease more.
func (g *Gateway) beat(ctx context.Context) {
	bctx, cancel := context.WithTimeout(ctx, g.lease())
	defer cancel()
	// A renewal round trip that has held its renewals for longer than
	// stallAfter is recorded before a heartbeat says this instance lives:
	// the record loop looks only every quarter of that, and a heartbeat
	// landing in between, the instance dying before the record, would
	// keep the listener from holding its users (see PingMargin).
	if g.reach.watch() {
		g.recordOngoing(bctx)
	}
	sent := time.Now()
	b, err := g.ctl.Heartbeat(bctx, g.instance, g.lease())
	if err != nil && ctx.Err() != nil {
		return // stopping: not a failure of Redis
	}
	// The grants that ran out since this heartbeat was sent are handed
	// over by the resync, as ran out in the outage. Not since the last one
	// that got through: Redis was in reach until some time after that, and
	// a silence the listener guided meanwhile, then lost with the data,
	// would be restored and guided twice. One that ran out in between, with
	// the data lost and no renewal failing to tell, is lost: the gateway
	// cannot tell it from one guided.
	forgotten := false
	switch {
	case err != nil:
		g.reach.lostSince(sent)
	case !g.beaten:
	case b.First:
		// Redis held no heartbeat of an instance that beat before: it lost
		// its data (a restart without it, a failover to a replica that
		// missed writes), or forgot an instance dead for a day. Every
		// session and route may be gone: write them back.
		g.log.Warn("Redis lost this instance's heartbeat, so it lost its data; resyncing every session")
		g.reach.lostSince(sent)
		forgotten = true
	case b.Gap:
		// The last lease ran out before this heartbeat, by Redis's clock:
		// this process stalled (a VM pause, CPU throttling) or its
		// heartbeats were late. Others took it for dead meanwhile, and
		// dropped it from its users' routes.
		g.log.Warn("heartbeat found a gap: this instance was dead by its lease; registering every user again")
		forgotten = true
	}
	if err == nil && g.restartSeen.Swap(false) {
		// A master restarted (see watchRestarts), perhaps without its
		// data; watchRestarts noted since when grants may be lost.
		forgotten = true
	}
	if err == nil {
		g.beaten = true
		g.beatSent = sent
	}
	sharedOK := true
	if err == nil && g.reach.staleFlushFail() {
		sharedOK = g.rdb.Ping(bctx).Err() == nil
	}
	// Others may have taken this instance for dead meanwhile, and dropped
	// it from its users' routes: not ready until every user is registered
	// again, from before the heartbeat counts as healed.
	var round uint64
	reregister := err == nil && (forgotten || g.beatFailed)
	if reregister {
		round = g.reach.unregistered()
	}
	g.shedIfCutOff()
	g.reach.beaten(err, sharedOK)
	if err != nil {
		metricHeartbeats.WithLabelValues("error").Inc()
		g.beatLog.Fail(err)
		g.beatFailed = true
		return
	}
	metricHeartbeats.WithLabelValues("ok").Inc()
	g.beatLog.OK()
	g.readInstances(bctx)
	switch {
	case reregister:
		// Register every user again, and restore their sessions as after
		// an outage.
		g.beatFailed = false
		g.routes.reregister(func() { g.reach.registered(round) })
		g.reach.owed()
		// A route write of another instance whose view of the heartbeats
		// predates this one may still land; the cut keeps what is written
		// from now on (judgeDead), and once more a lease later covers the
		// clocks of other Redis nodes.
		g.echoAt = time.Now().Add(g.lease())
	case !g.echoAt.IsZero() && time.Since(g.echoAt) >= 0:
		g.echoAt = time.Time{}
		g.routes.markAll()
	}
}

// shedIfCutOff closes every client connection once Redis has been out of
// reach for ShedAfter, once per outage: the listener holds this instance's
// users only for its grace after the last heartbeat, and while the
// instance is cut off their pings renew nothing. Told to try again later
// (1013), they reconnect, through the load balancer, to an instance that
// can renew them (this one is not ready meanwhile). The heartbeat loop's
// own.
func (g *Gateway) shedIfCutOff() {
	since := g.reach.cutOffSince()
	if since.IsZero() {
		g.shed = false
		return
	}
	if g.shed || !shedDue(since, time.Now(), g.cfg.ShedAfter) {
		return
	}
	g.shed = true
	conns := g.hub.all()
	g.log.Warn("Redis out of reach: closing every connection so that clients reconnect to an instance that can renew them",
		"since", since, "connections", len(conns))
	metricShed.Add(float64(len(conns)))
	for _, c := range conns {
		c.closeNow(websocket.CloseTryAgainLater, "session store unreachable, reconnect later")
		c.ws.NetConn().Close() // the reader fails at once, and Closed releases it
	}
}

// leave marks this instance gone, once its connections are. A drain is
// recorded once more first, up to now: the users it told to go are held
// until the grace after it ends, and the instance's lease until the grace
// after it leaves.
func (g *Gateway) leave() {
	if g.drainRec != nil {
		g.recordDrain()
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	if err := g.ctl.Leave(ctx, g.instance); err != nil {
		g.log.Warn("leave: the listener will find this instance's lease run out instead", "err", err)
	}
}

// resyncLoop resyncs when kicked, if anything failed since the last
// resync that completed, and otherwise records an outage still owed (a
// round trip that was late). Kicks during a resync make it run again
// after; a resync that fails is retried.
func (g *Gateway) resyncLoop(ctx context.Context) {
	var synced uint64 // failures that a completed resync followed
	retry := time.NewTimer(resyncRetry)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.reach.kick:
		case <-retry.C:
		}
		from, failures := g.reach.outage()
		restore := failures != synced
		if !restore && g.reach.unrecorded().IsZero() {
			continue
		}
		if err := g.resync(ctx, restore, from); err != nil {
			if ctx.Err() != nil {
				return
			}
			g.resyncLog.Fail(err)
			retry.Reset(resyncRetry)
			continue
		}
		g.resyncLog.OK()
		// The outage's start is forgotten after a record alone too: the
		// late round trips it followed lost nothing.
		g.reach.resynced(failures)
		synced = failures
	}
}

// recordLoop records renewal outages while they last: when a round trip
// fails, and when one in flight has held its renewals for longer than
// stallAfter, which it looks for every quarter of that. It runs beside the
// resync loop, whose resync may itself wait on the round trip that hangs.
func (g *Gateway) recordLoop(ctx context.Context) {
	t := time.NewTicker(g.reach.slow / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.reach.failed:
		case <-t.C:
			if !g.reach.watch() {
				continue
			}
		}
		g.recordOngoing(ctx)
	}
}

// ongoing is a renewal outage recorded while it lasts: its last record.
type ongoing struct {
	b  session.BlindInterval
	at time.Time // when it was written, by the local clock
}

// ongoingRecord is the record of the renewal outage under way, if any.
// mu orders its writers, the record loop's records of the outage so far
// and the resync's of the whole: none lands after the whole one.
type ongoingRecord struct {
	mu   sync.Mutex
	open *ongoing
}

// recordOngoing records a renewal outage so far, while it lasts, when
// Redis takes heartbeats meanwhile, at most every ongoingRecordEvery. Each
// record replaces the last, so an outage keeps one. Where Redis is out of
// reach the heartbeat gap protects the users, and the record waits for
// the recovery.
func (g *Gateway) recordOngoing(ctx context.Context) {
	g.ongoing.mu.Lock()
	defer g.ongoing.mu.Unlock()
	open := g.ongoing.open
	since := g.reach.unrecorded()
	if since.IsZero() || !g.reach.partial() || (open != nil && time.Since(open.at) < ongoingRecordEvery) {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, g.lease())
	defer cancel()
	at := time.Now()
	b, err := g.ctl.RecordBlindFrom(rctx, since, g.instance, session.BlindRenewals)
	if err != nil {
		g.log.Debug("record the renewal outage while it lasts; recovery records it", "err", err)
		return
	}
	g.forgetOngoing(rctx, open)
	g.log.Info("renewals failing: recorded the outage so far", "from", b.Start, "to", b.End, "for", b.End.Sub(b.Start))
	g.ongoing.open = &ongoing{b: b, at: at}
}

// forgetOngoing removes the record of an outage that a later one covers.
func (g *Gateway) forgetOngoing(ctx context.Context, open *ongoing) {
	if open == nil {
		return
	}
	if err := g.ctl.ForgetBlind(ctx, open.b); err != nil {
		g.log.Debug("remove a record of a renewal outage that a later one covers", "err", err)
	}
}

// resync records the renewal outage it follows, if any, as a blind
// interval of this instance (replacing its record while it lasted), and
// only then, with restore, restores every connection's last grant, and
// the lapsed ones that ran out at or after from, the outage's start
// (zero: none): the listener that meets a deadline the outage let lapse,
// or one restored at its deadline in it, finds the outage recorded.
func (g *Gateway) resync(ctx context.Context, restore bool, from time.Time) error {
	start := time.Now()
	if err := g.recordWhole(ctx); err != nil {
		return err
	}
	if !restore {
		return nil
	}
	if err := g.recordFrom(ctx, from); err != nil {
		return err
	}
	n, err := g.resyncConns(ctx, from)
	if err != nil {
		return fmt.Errorf("resync sessions: %d restored before: %w", n, err)
	}
	metricResynced.Add(float64(n))
	g.log.Info("resynced sessions", "sessions", n, "took", time.Since(start))
	return nil
}

// recordWhole records the renewal outage not recorded yet, if any, in
// place of its record while it lasted.
func (g *Gateway) recordWhole(ctx context.Context) error {
	g.ongoing.mu.Lock()
	defer g.ongoing.mu.Unlock()
	since := g.reach.unrecorded()
	if since.IsZero() {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
	defer cancel()
	at := time.Now()
	b, err := g.ctl.RecordBlindFrom(rctx, since, g.instance, session.BlindRenewals)
	if err != nil {
		return err
	}
	g.forgetOngoing(rctx, g.ongoing.open)
	g.ongoing.open = nil
	g.reach.recorded(at)
	g.log.Info("recorded renewal outage", "from", b.Start, "to", b.End, "for", b.End.Sub(b.Start))
	return nil
}

// recordFrom records the outage a restoring resync follows, from its
// start as this instance tells it (zero: none), as a blind interval of
// this instance: a grant that ran out in it is restored at its own
// deadline, at or after from, and this holds it for the grace. recordWhole
// records failed renewals only; heartbeats that failed, or found Redis's
// data lost, leave no record of their own that survives the loss.
func (g *Gateway) recordFrom(ctx context.Context, from time.Time) error {
	if from.IsZero() {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
	defer cancel()
	b, err := g.ctl.RecordBlindFrom(rctx, from, g.instance, session.BlindGateway)
	if err != nil {
		return err
	}
	g.log.Info("recorded the outage a resync follows", "from", b.Start, "to", b.End, "for", b.End.Sub(b.Start))
	return nil
}

// handedOver reports whether a resync at now hands over gr: if it has
// time left, or if it ran out at or after from, the start of the outage
// the resync follows (times since the gateway started; from is negative
// when the resync follows no outage, as after a heartbeat gap). from is
// the earliest Redis may have been out of reach, or lost its data, as far
// as this instance can tell (see reach.lapseFrom): when the first failed
// renewals were queued, or when the heartbeat that failed, or found that
// Redis had lost its data, was sent. Not the last heartbeat that got
// through: Redis was in reach for a while after it, and a silence the
// listener guided then, and lost with the data, would be restored and
// guided twice. A grant that ran out in between, with the data lost and
// no renewal failing, is lost: the gateway cannot tell it from one
// guided, and one guide twice is worse. Nothing earlier is handed over: a
// grant that ran out while Redis was in reach was Redis's to guide.
func handedOver(gr session.Grant, now, from time.Duration) bool {
	return gr.Left > 0 || (from >= 0 && now+gr.Left >= from)
}

// resyncConns hands every connection's last grant to the renewer, in
// batches, if it has time left or ran out at or after from (see
// handedOver), and returns how many it sent. It stops at the first error:
// Redis is out of reach again, and the next resync starts over.
func (g *Gateway) resyncConns(ctx context.Context, from time.Time) (int, error) {
	grants := make([]session.Grant, 0, resyncBatch)
	conns := make([]*conn, 0, resyncBatch)
	total := 0
	send := func() error {
		// Each restored grant parks as a renewal would, by its segment's
		// clock in the policy in force.
		p := g.policy.Current()
		for i := range grants {
			grants[i].Clock = p.Clock(grants[i].Segment)
		}
		n, err := g.renewer.Resync(ctx, grants)
		total += n
		// A user who closed normally while their grant was on its way
		// may have their session back: end it again, after, if that was
		// their last connection.
		for _, c := range conns {
			if c.grant.Load() == 0 {
				g.routes.mark(c.uid, c.normalEnd(), nil)
			}
		}
		grants, conns = grants[:0], conns[:0]
		return err
	}
	now, fromAt := time.Since(g.start), time.Duration(-1)
	if !from.IsZero() {
		fromAt = max(0, from.Sub(g.start))
	}
	// When every grant below was measured: the renewer ages each by the
	// time its batch waits (see session.Grant).
	taken := g.start.Add(now)
	var shardConns []*conn
	for shard := range hubShards {
		shardConns = g.hub.appendShard(shardConns[:0], shard, nil)
		for _, c := range shardConns {
			gr, ok := c.lastGrant(now)
			if !ok || !handedOver(gr, now, fromAt) {
				continue
			}
			gr.Taken = taken
			grants, conns = append(grants, gr), append(conns, c)
			if len(grants) == resyncBatch {
				if err := send(); err != nil {
					return total, err
				}
			}
		}
	}
	// Connections dropped while their grants run: their sessions may be
	// gone with Redis's data too. A grant older than a renewal Redis
	// knows of (the user reconnected, or left) restores nothing.
	keep := now
	if fromAt >= 0 {
		keep = min(now, fromAt)
	}
	for _, gr := range g.dropped.left(now, keep) {
		if !handedOver(gr, now, fromAt) {
			continue
		}
		gr.Taken = taken
		grants = append(grants, gr)
		if len(grants) == resyncBatch {
			if err := send(); err != nil {
				return total, err
			}
		}
	}
	if len(grants) == 0 {
		return total, nil
	}
	return total, send()
}
