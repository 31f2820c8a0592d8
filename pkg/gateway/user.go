package gateway

import (
	"math"
	"sync"
	"time"
)

// One user's place on this gateway bounds what one token can take of it:
//
//   - connections: a user holds at most max-user-conns here, those being
//     set up counted, and is refused beyond with HTTP 429, which says
//     "you", not "this instance" (503). Without it one token took every
//     connection of an instance, and every other user was refused. The
//     cap is per instance: it is checked without a Redis round trip (also
//     while Redis is out of reach), and nothing is left to count down when
//     an instance dies. A user can hold the cap on each instance, but no
//     instance is taken from the others.
//   - renewals: one renewal covers the user, whichever device pinged, so
//     the user's connections share their renewals. A ping within the
//     renewal granularity of the user's last renewal in its segment is
//     answered from it (waiting for it while it is being written), and
//     takes its grant as the connection's own, for a resync or the
//     dropped grants. A user's connections then cost Redis one renewal
//     per granularity and segment, not one each.

// user is one user's place on this gateway, guarded by the lock of the
// hub shard that holds it: conns (a list through each connection's next),
// pending and renewals. A lock of its own would cost every user 8 bytes,
// and a ping takes the shard's for a moment.
type user struct {
	conns    *conn
	pending  int // places reserved for connections being set up
	renewals renewals
}

// admit decides whether a user holding held connections (those being set
// up included) may open one more under capacity.
func admit(held, capacity int) bool { return held < capacity }

// shareRenewal decides whether a ping at now, on a connection registered
// at since, is answered from the user's last renewal in its segment, made
// at at and failed or not (a pending one has not failed), instead of a
// renewal of its own. Times are since the gateway started.
//
// A renewal that failed is not shared: the ping tries again. One made
// before the connection registered is not shared either: the session it
// renewed may have ended since (a close stage's guide, the user leaving),
// and a new connection's ping must write it back. Within the granularity
// a ping's deadline lags its own by less than the granularity, as it does
// for one connection's pings.
func shareRenewal(at time.Duration, failed bool, since, now, granularity time.Duration) bool {
	return !failed && at >= since && now-at < granularity
}

// renewals are the last renewal among one user's connections here, of
// whichever segment. A ping of another segment takes its place: a user
// whose devices ping in two segments within one granularity renews more
// often than once per segment (a Redis write each), which is rare, and
// costs no guide; in return an idle user keeps one renewal, not a list.
type renewals struct {
	last *renewal
}

// renewal is one renewal of a user's session, shared by the pings of
// their connections within the granularity. segment, at and ttl are
// fixed; the rest is guarded by the lock of its renewals.
type renewal struct {
	segment string
	at      time.Duration // the ping's time, since the gateway started
	// deadlineMS is the deadline of this grant (Unix ms, Redis's clock),
	// for the sharers' pongs.
	deadlineMS int64
	// then is what the sharers do once it is settled (whenSettled), in
	// the order they came; nil once called.
	then  func()
	ttlMS int32 // granted (a TTL is whole ms, and at most days)
	// doneMS is when it was settled, in ms after at (at least 1), and
	// negative when it failed; 0 while it is pending. One field for
	// both, where two flags and a time would take the struct past 48
	// bytes.
	doneMS int32
}

// settled reports whether r was written, or failed. Its lock is held.
func (r *renewal) settled() bool { return r.doneMS != 0 }

// failed reports whether r's write failed. Its lock is held, or r is
// settled.
func (r *renewal) failed() bool { return r.doneMS < 0 }

// settledAt is when r was settled, since the gateway started. r is
// settled.
func (r *renewal) settledAt() time.Duration {
	return r.at + time.Duration(max(r.doneMS, -r.doneMS))*time.Millisecond
}

// ttl is the TTL r granted.
func (r *renewal) ttl() time.Duration { return time.Duration(r.ttlMS) * time.Millisecond }

// claim returns the renewal a ping of segment at now shares (own false),
// or a new renewal granting ttl that the caller writes and then settles
// (own true). since is when the pinging connection registered. mu is the
// lock that guards rs, as for settle and whenSettled.
func (rs *renewals) claim(mu sync.Locker, segment string, since, now, granularity, ttl time.Duration) (r *renewal, own bool) {
	mu.Lock()
	defer mu.Unlock()
	if last := rs.last; last != nil && last.segment == segment && shareRenewal(last.at, last.failed(), since, now, granularity) {
		return last, false
	}
	r = &renewal{segment: segment, at: now, ttlMS: int32(ttl.Milliseconds())}
	rs.last = r
	return r, true
}

// settle records the outcome of r's write, at now (since the gateway
// started), and releases its sharers.
// Called once, by the renewal's owner; the sharers' then runs on its
// goroutine, and must not block.
func (rs *renewals) settle(mu sync.Locker, r *renewal, now time.Duration, deadline time.Time, err error) {
	mu.Lock()
	// Rounded up: never before the reply.
	r.doneMS = int32(min(max((now-r.at+time.Millisecond-1)/time.Millisecond, 1), math.MaxInt32))
	if err != nil {
		r.doneMS = -r.doneMS
	} else {
		r.deadlineMS = deadline.UnixMilli()
	}
	then := r.then
	r.then = nil
	mu.Unlock()
	if then != nil {
		then()
	}
}

// whenSettled calls f once r is settled: at once if it is, else on the
// goroutine that settles it, after the sharers that came before. f reads
// r's outcome (failed, deadlineMS) and must not block.
func (rs *renewals) whenSettled(mu sync.Locker, r *renewal, f func()) {
	mu.Lock()
	if r.settled() {
		mu.Unlock()
		f()
		return
	}
	if prev := r.then; prev != nil {
		r.then = func() { prev(); f() }
	} else {
		r.then = f
	}
	mu.Unlock()
}
