package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrRenewerStopped means a renewal came after the Renewer stopped.
var ErrRenewerStopped = errors.New("session renewer stopped")

// RenewerConfig tunes a Renewer.
type RenewerConfig struct {
	// FlushInterval is the longest a renewal waits for others to share its
	// round trip. Default 2ms.
	FlushInterval time.Duration
	// MaxBatch flushes at once when this many renewals are waiting.
	// Default 256.
	MaxBatch int
	// QueueSize bounds the renewals waiting to be batched; beyond it
	// Renew blocks (backpressure), and RenewAsync's renewals wait their
	// turn, off their callers' goroutines, for up to QueueWait.
	// Default 8192.
	QueueSize int
	// OnFlush, when set, observes each round trip: its size and latency.
	OnFlush func(size int, took time.Duration, err error)
	// OnDropped, when set, observes a RenewAsync renewal that failed for
	// want of room in the queue, with when it was queued: it never reached
	// a round trip, so OnFlush does not see it.
	OnDropped func(queued time.Time)
	// OnUnrouted, when set, is told the uid of each renewal (not a
	// resync) that found the user's route not naming Instance, whose
	// connection it renews for: a node restarted without its data lost
	// the route, or another instance dropped this one's entry as dead.
	// It is called on Run's goroutine, so it must not block.
	OnUnrouted func(uid string)
	// Instance names the gateway instance whose connections renew, so the
	// listener can tell its users' deadlines apart when it dies. Empty
	// records none.
	Instance string
	// QueueWait is how long a RenewAsync renewal waits for room in a
	// full queue before it fails, as a Renew caller's context would end
	// its wait. Default 10s.
	QueueWait time.Duration
	// SlotRetry is how long a round trip sends again the renewals a Redis
	// Cluster refuses while their slot migrates (TRYAGAIN, ASK, MOVED),
	// with short pauses; past it they fail. The round trip takes that much
	// longer, and holds up the renewals behind it, so it must stay under
	// what the caller counts as an outage. Default DefaultSlotRetry.
	SlotRetry time.Duration
}

// Renewer coalesces renewals from many connections into pipelined round
// trips: it flushes every FlushInterval or MaxBatch renewals, whichever
// comes first, and while one round trip is in flight the next batch
// gathers. Each renewal is still one atomic script.
type Renewer struct {
	store *Store
	cfg   RenewerConfig
	reqs  chan *renewal

	mu      sync.Mutex // guards stopped and the Add of senders
	stopped bool
	senders sync.WaitGroup // Renew calls between the stopped check and their send

	// overflow are RenewAsync renewals that found the queue full, oldest
	// first, which one feeder goroutine (running while there are any)
	// hands to Run as room comes, in order: the caller never waits for
	// room. Guarded by mu.
	overflow []*renewal
	feeding  bool

	// inFlight is when the oldest renewal of the round trip in flight was
	// queued, in Unix ns; 0 between round trips. Run's to write.
	inFlight atomic.Int64
}

type renewal struct {
	uid, segment string
	ttl          time.Duration
	clock        Clock         // the segment's
	end          bool          // End the session instead
	resync       bool          // restore a grant; ttl is what is left of it
	lapsed       bool          // with resync: the grant ran out, ttl ago (at most 0)
	ago          time.Duration // with resync: how long ago the ping was
	taken        time.Time     // with resync: when ttl and ago were measured
	queued       time.Time     // when it was handed to Run
	deadline     time.Time
	err          error
	// done is closed once the renewal is settled, for a caller that
	// waits (Renew, End, Resync); then is called instead, for one that
	// does not (RenewAsync).
	done chan struct{}
	then func(deadline time.Time, err error)
}

// settle tells the renewal's caller its outcome.
func (req *renewal) settle() {
	if req.then != nil {
		req.then(req.deadline, req.err)
		return
	}
	close(req.done)
}

// NewRenewer returns a Renewer over store; call Run to start it.
func NewRenewer(store *Store, cfg RenewerConfig) *Renewer {
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 2 * time.Millisecond
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 256
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 8192
	}
	if cfg.QueueWait <= 0 {
		cfg.QueueWait = 10 * time.Second
	}
	if cfg.SlotRetry <= 0 {
		cfg.SlotRetry = DefaultSlotRetry
	}
	return &Renewer{store: store, cfg: cfg, reqs: make(chan *renewal, cfg.QueueSize)}
}

// Renew grants uid's session ttl, sharing a round trip with other
// renewals, and returns the deadline this grant gave, by Redis's clock:
// ttl from Redis's now. The session's own is never earlier; it is later
// while another device's grant runs longer, or while the segment's clock
// is held (see renewScript).
func (r *Renewer) Renew(ctx context.Context, uid, segment string, ttl time.Duration, clock Clock) (time.Time, error) {
	if err := checkSegment(uid, segment); err != nil {
		return time.Time{}, err
	}
	return r.do(ctx, &renewal{uid: uid, segment: segment, ttl: ttl, clock: clock, done: make(chan struct{})})
}

// RenewAsync is Renew without the wait: done is called once with what
// Renew would return. It is called on Run's goroutine after the round
// trip, so it must not block: it would hold up every renewal queued
// behind. A renewal that cannot be queued fails on the caller's goroutine
// (the renewer stopped) or, when the queue stayed full for QueueWait, on
// the goroutine that waited for room. Renewals of one caller are sent in
// the order asked.
func (r *Renewer) RenewAsync(uid, segment string, ttl time.Duration, clock Clock, done func(deadline time.Time, err error)) {
	if err := checkSegment(uid, segment); err != nil {
		done(time.Time{}, err)
		return
	}
	req := &renewal{uid: uid, segment: segment, ttl: ttl, clock: clock, then: done}
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		done(time.Time{}, ErrRenewerStopped)
		return
	}
	req.queued = time.Now()
	if len(r.overflow) == 0 {
		select {
		case r.reqs <- req:
			r.mu.Unlock()
			return
		default:
		}
	}
	// Full: behind those waiting already, so that a caller's renewals
	// keep their order.
	r.overflow = append(r.overflow, req)
	if !r.feeding {
		r.feeding = true
		r.senders.Add(1) // Run's stop takes in what the feeder still sends
		go r.feed()
	}
	r.mu.Unlock()
}

// feed hands the overflow to Run, oldest first, as room comes; one that
// waited QueueWait fails. It returns once the overflow is empty.
func (r *Renewer) feed() {
	defer r.senders.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		if len(r.overflow) == 0 {
			r.feeding = false
			r.overflow = nil
			r.mu.Unlock()
			return
		}
		req := r.overflow[0]
		r.overflow[0] = nil
		r.overflow = r.overflow[1:]
		r.mu.Unlock()
		timer.Reset(time.Until(req.queued.Add(r.cfg.QueueWait)))
		select {
		case r.reqs <- req:
		case <-timer.C:
			req.err = fmt.Errorf("renew session %q: no room in the renewal queue for %v: %w", req.uid, r.cfg.QueueWait, context.DeadlineExceeded)
			if r.cfg.OnDropped != nil {
				r.cfg.OnDropped(req.queued)
			}
			req.settle()
		}
	}
}

// End deletes uid's session and its index entry, as Store.End does, in
// the same round trips as renewals: a burst of users leaving at once
// (a client release, a network's clients closing together) costs a few
// pipelined round trips, not one each.
func (r *Renewer) End(ctx context.Context, uid string) error {
	_, err := r.do(ctx, &renewal{uid: uid, end: true, done: make(chan struct{})})
	return err
}

// Grant is a renewal a gateway made, or tried to make, for one
// connection: what Resync restores.
type Grant struct {
	UID, Segment string
	// Left is what remains of the grant: its deadline is Redis's now plus
	// Left. Resync never writes a later deadline than that. Zero or less:
	// the grant ran out, and is restored only as a lapsed one (see
	// Resync).
	Left time.Duration
	// Ago is how long ago the ping was that asked for the grant: the
	// renewal is recorded then, not at the resync.
	Ago time.Duration
	// Clock is the segment's clock, from the policy in force: a grant
	// restored while the user's clock is held is parked, as a renewal is.
	Clock Clock
	// Taken is when Left and Ago were measured, by the local clock; zero:
	// when Resync is called. Each is aged by the time since, when its
	// script is sent: a resync waits behind an outage's retries and the
	// batches before it, and its deadline must be the grant's own, not
	// that much later.
	Taken time.Time
}

// Resync restores grants that could not be written while Redis was out of
// reach, or that Redis lost, sharing round trips as renewals do, and
// returns how many it sent and the first error (a grant of a segment
// that is not a segment's name is not sent, and is that error). A grant
// never shortens a deadline already written: resync restores the truth,
// it gives no extra time.
//
// A grant with nothing left (Left <= 0) ran out in the outage: the caller
// hands over only those that ran out after the outage began. Its silence
// is still owed a guide, once: it is restored at its own deadline (past:
// due at once, and the deadline its guide names), for the listener to
// hold until the grace after the outage, only if the silence
// cannot have been handled already (see renewScript's mode "lapsed"):
// while the user's timeout is pending, when Redis knows nothing of the
// user, or between the stages of a silence its ping came after (the user
// came back after the guide); never between the stages of a silence its
// ping is older than, nor when Redis knows a renewal or end as new as
// its ping.
func (r *Renewer) Resync(ctx context.Context, grants []Grant) (int, error) {
	reqs := make([]*renewal, 0, len(grants))
	var firstErr error
	now := time.Now()
	for _, g := range grants {
		if err := checkSegment(g.UID, g.Segment); err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		req := &renewal{uid: g.UID, segment: g.Segment, ttl: g.Left, clock: g.Clock,
			resync: true, ago: g.Ago, taken: cmp.Or(g.Taken, now), done: make(chan struct{})}
		_, _, req.lapsed = req.aged(now)
		if err := r.enqueue(ctx, req); err != nil {
			firstErr = err
			break
		}
		reqs = append(reqs, req)
	}
	for _, req := range reqs {
		<-req.done
		firstErr = cmp.Or(firstErr, req.err)
	}
	return len(reqs), firstErr
}

func (r *Renewer) do(ctx context.Context, req *renewal) (time.Time, error) {
	if err := r.enqueue(ctx, req); err != nil {
		return time.Time{}, err
	}
	// Once queued, the renewal is always flushed, so waiting is bounded
	// by Run's round trip.
	<-req.done
	return req.deadline, req.err
}

func (r *Renewer) enqueue(ctx context.Context, req *renewal) error {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return ErrRenewerStopped
	}
	r.senders.Add(1)
	r.mu.Unlock()
	defer r.senders.Done()
	req.queued = time.Now()
	select {
	case r.reqs <- req:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run batches renewals until ctx is done, then refuses new ones, flushes
// what is queued and returns: no accepted renewal is dropped.
func (r *Renewer) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	batch := make([]*renewal, 0, r.cfg.MaxBatch)
	flush := func() {
		timer.Stop()
		if len(batch) > 0 {
			r.flush(batch)
			batch = batch[:0]
		}
	}
	for {
		select {
		case req := <-r.reqs:
			if len(batch) == 0 {
				timer.Reset(r.cfg.FlushInterval)
			}
			batch = append(batch, req)
			if len(batch) >= r.cfg.MaxBatch {
				flush()
			}
		case <-timer.C:
			flush()
		case <-ctx.Done():
			// Refuse new renewals, then take in those already on their way
			// until their senders are all through.
			r.mu.Lock()
			r.stopped = true
			r.mu.Unlock()
			sent := make(chan struct{})
			go func() { r.senders.Wait(); close(sent) }()
			for draining := true; draining; {
				select {
				case req := <-r.reqs:
					batch = append(batch, req)
				case <-sent:
					for len(r.reqs) > 0 {
						batch = append(batch, <-r.reqs)
					}
					draining = false
				}
				if len(batch) >= r.cfg.MaxBatch {
					flush()
				}
			}
			flush()
			return
		}
	}
}

// Waiting is when the oldest renewal of the round trip in flight was
// queued, or zero between round trips. Round trips go one at a time, so
// one that hangs (a cluster master that stopped or died, its commands in
// the client's retries) holds every renewal in it and every one queued
// behind it, past the deadlines they were to extend: a caller that
// watches this can tell while it lasts, not only once it returns.
func (r *Renewer) Waiting() time.Time {
	ns := r.inFlight.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// flush sends a batch in one pipeline (see runScripts): a renewal whose
// script is missing from Redis's cache (first use, a restarted Redis, a
// slot moved to a node that never ran it) is sent again with the
// script's source, and one a migrating cluster slot refused is sent
// again until it lands or SlotRetry has passed. Renewals are idempotent,
// and a refused one never ran.
func (r *Renewer) flush(batch []*renewal) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	oldest := start
	for _, req := range batch {
		if !req.queued.IsZero() && req.queued.Before(oldest) {
			oldest = req.queued
		}
	}
	r.inFlight.Store(oldest.UnixNano())
	cmds := r.store.runScripts(ctx, len(batch), r.call(batch), r.cfg.SlotRetry)
	r.inFlight.Store(0)
	var firstErr error
	for i, req := range batch {
		if req.end {
			if err := cmds[i].Err(); err != nil {
				req.err = fmt.Errorf("end session %q: %w", req.uid, err)
				firstErr = cmp.Or(firstErr, err)
			}
			req.settle()
			continue
		}
		ms, err := cmds[i].Int64Slice()
		if err == nil && len(ms) != 3 {
			err = fmt.Errorf("renew script answered %d values, want 3", len(ms))
		}
		if err != nil {
			req.err = fmt.Errorf("renew session %q: %w", req.uid, err)
			firstErr = cmp.Or(firstErr, err)
		} else {
			req.deadline = time.UnixMilli(ms[1])
		}
		req.settle()
		if err == nil && ms[2] == 1 && !req.resync && r.cfg.OnUnrouted != nil {
			r.cfg.OnUnrouted(req.uid)
		}
	}
	if r.cfg.OnFlush != nil {
		r.cfg.OnFlush(len(batch), time.Since(start), firstErr)
	}
}

// call is the renewal (or end) script call of each request of batch.
func (r *Renewer) call(batch []*renewal) scriptCall {
	ks := r.store.ks
	return func(i int) (*redis.Script, []string, []any) {
		req := batch[i]
		keys := ks.grantKeys(req.uid)
		if req.end {
			return endScript.call(keys, r.store.withNotes(req.uid, RenewedKeep.Milliseconds())...)
		}
		mode, ttl, ago := modeRenew, req.ttl, req.ago
		if req.resync {
			var lapsed bool
			ttl, ago, lapsed = req.aged(time.Now())
			mode = modeResync
			if lapsed {
				mode = modeLapsed
			}
		}
		return renewScript.call(keys, r.store.withNotes(req.uid, ttl.Milliseconds(), req.segment, r.cfg.Instance, mode,
			RenewedKeep.Milliseconds(), max(0, ago.Milliseconds()), string(req.clock), MaxTurnHold.Milliseconds())...)
	}
}

// aged is a resync's grant as it stands at now: what is left of it and how
// long ago its ping was, each moved by the time since they were measured,
// and whether it has run out (less than a millisecond left counts as
// none: a grant handed over lapsed stays so). A grant that ran out while
// its resync waited ran out in the outage it follows, and is restored as
// lapsed. What is left of a lapsed one is how long ago it ran out, at
// most 0: it is restored at its own deadline.
func (req *renewal) aged(now time.Time) (left, ago time.Duration, lapsed bool) {
	waited := max(0, now.Sub(req.taken))
	left = (req.ttl - waited).Truncate(time.Millisecond)
	lapsed = req.lapsed || left < time.Millisecond
	if lapsed {
		left = min(left, 0)
	}
	return left, req.ago + waited, lapsed
}
