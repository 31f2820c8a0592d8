package session

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The control keys ({ctl}) say when users could not reach us: gateway
// heartbeats, blind intervals, the last complete sweep. The listener reads
// them on every sweep to decide which timeouts are a silence the user
// caused and which an outage may have caused. Every time in them is
// Redis's clock.

// Reasons for a blind interval.
const (
	BlindSweepGap  = "sweep-gap"     // nobody swept the index (Redis or every listener was out)
	BlindDataLost  = "data-lost"     // Redis lost the sweep mark: a restart without its data
	BlindClockJump = "clock-jump"    // Redis's clock stepped forward
	BlindReadStall = "read-stall"    // a listener's own read of the deadlines stalled: never recorded, held briefly
	BlindGateway   = "gateway-gap"   // one gateway instance could not reach Redis
	BlindFleetDown = "fleet-down"    // no gateway instance was alive
	BlindRenewals  = "renewals-gap"  // a gateway's renewals failed, as it reports on recovery
	BlindRestart   = "redis-restart" // a Redis master restarted (a new run id)
	BlindFailover  = "failover"      // a Redis Cluster failover (a replica promoted, a master failed or demoted)
	BlindDrain     = "gateway-drain" // a gateway instance stopping told its clients to reconnect elsewhere
	// BlindActivityLag: the activity feed lagged or Kafka was down, and
	// the platform's records of that time may still come.
	BlindActivityLag = "activity-lag"
)

// heartbeatScript records that a gateway instance is alive for lease ms
// more. If it was not (a gap longer than its lease), it records the gap as
// a blind interval of that instance; if no instance was alive at all, a
// blind interval of the whole fleet from the last one seen alive.
// ARGV: instance, lease ms. Returns {Redis's now,
// 1 if the instance had no heartbeat before, 1 if its last lease ran out
// before this heartbeat}.
var heartbeatScript = newScript[heartbeatKeys]("heartbeat",
	heartbeatReasons{GatewayGap: BlindGateway, FleetDown: BlindFleetDown}, []codec{aliveFormat, blindFormat})

// Beat is what a heartbeat found.
type Beat struct {
	Now time.Time // Redis's clock
	// First means Redis held no heartbeat of the instance: its first, or,
	// for an instance that beat before, a Redis that lost its data.
	First bool
	// Gap means the instance's last lease ran out before this heartbeat,
	// by Redis's clock: others may have judged it dead meanwhile, and
	// dropped it from its users' routes.
	Gap bool
}

// Heartbeat says that gateway instance is alive for lease more, by Redis's
// clock.
func (s *Store) Heartbeat(ctx context.Context, instance string, lease time.Duration) (Beat, error) {
	vals, err := heartbeatScript.Run(ctx, s.rdb, heartbeatKeys{Alive: s.ks.AliveKey(), Blind: s.ks.BlindKey()},
		instance, lease.Milliseconds()).Int64Slice()
	if err != nil {
		return Beat{}, fmt.Errorf("heartbeat of %q: %w", instance, err)
	}
	if len(vals) != 3 {
		return Beat{}, fmt.Errorf("heartbeat of %q: %w: %d values", instance, errReply, len(vals))
	}
	return Beat{Now: time.UnixMilli(vals[0]), First: vals[1] == 1, Gap: vals[2] == 1}, nil
}

// Leave marks a gateway instance dead now, as a stop that closed its
// connections: its users' deadlines get the grace of a dead instance.
func (s *Store) Leave(ctx context.Context, instance string) error {
	_, err := s.Heartbeat(ctx, instance, 0)
	return err
}

// BlindInterval is a time in which some or all users could not reach us.
type BlindInterval struct {
	Start, End time.Time
	// Scope is the gateway instance whose users it concerns, or "" for
	// everyone.
	Scope  string
	Reason string
}

func (b BlindInterval) member() string {
	return blindFormat.encode(strconv.FormatInt(b.Start.UnixMilli(), 10), strconv.FormatInt(b.End.UnixMilli(), 10),
		b.Reason, b.Scope)
}

// ParseBlindInterval decodes a blind interval as stored:
// "start:end:reason:scope", times in Unix ms; the scope, last, may hold
// colons.
func ParseBlindInterval(m string) (BlindInterval, error) {
	parts, ok := blindFormat.decode(m)
	if !ok {
		return BlindInterval{}, fmt.Errorf("blind interval %q: want start:end:reason:scope", m)
	}
	start, err1 := strconv.ParseInt(parts[0], 10, 64)
	end, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil || start < 0 || end < start {
		return BlindInterval{}, fmt.Errorf("blind interval %q: bad times", m)
	}
	if parts[2] == "" {
		return BlindInterval{}, fmt.Errorf("blind interval %q: no reason", m)
	}
	return BlindInterval{Start: time.UnixMilli(start), End: time.UnixMilli(end), Reason: parts[2], Scope: parts[3]}, nil
}

// RecordBlind stores a blind interval.
func (s *Store) RecordBlind(ctx context.Context, b BlindInterval) error {
	err := s.rdb.ZAdd(ctx, s.ks.BlindKey(), redis.Z{Score: float64(b.End.UnixMilli()), Member: b.member()}).Err()
	if err != nil {
		return fmt.Errorf("record blind interval: %w", err)
	}
	return nil
}

// ForgetBlind removes a blind interval, as one that a longer one of the
// same outage, recorded since, replaces.
func (s *Store) ForgetBlind(ctx context.Context, b BlindInterval) error {
	if err := s.rdb.ZRem(ctx, s.ks.BlindKey(), b.member()).Err(); err != nil {
		return fmt.Errorf("forget blind interval: %w", err)
	}
	return nil
}

// RecordBlindFrom stores a blind interval that ended now, by Redis's
// clock, and began at since by the local one, as a gateway measures an
// outage of its own. How long it lasted is taken once Redis has told its
// time, so that a slow answer moves the start earlier, never later than
// since. It returns the interval.
func (s *Store) RecordBlindFrom(ctx context.Context, since time.Time, scope, reason string) (BlindInterval, error) {
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return BlindInterval{}, fmt.Errorf("record blind interval: %w", err)
	}
	took := time.Since(since)
	now = now.Truncate(time.Millisecond)
	b := BlindInterval{Start: now.Add(-took).Truncate(time.Millisecond), End: now, Scope: scope, Reason: reason}
	return b, s.RecordBlind(ctx, b)
}

// blindSinceScript records a blind interval from a start to now, by
// Redis's clock, and removes the record it replaces, in one step: an
// interval that lasts is recorded again and again, and at no moment is
// none of its records there. ARGV: start ms (0: now), reason, scope, the
// member replaced ("" for none). Returns {start, now}.
var blindSinceScript = newScript[blindKeys]("blind_since", nil, []codec{blindFormat})

// RecordBlindSince stores a blind interval from start (zero: now) to now,
// by Redis's clock, replacing prev, the record of the same interval so
// far, if not nil. It returns the interval.
func (s *Store) RecordBlindSince(ctx context.Context, start time.Time, scope, reason string, prev *BlindInterval) (BlindInterval, error) {
	var startMS int64
	if !start.IsZero() {
		startMS = start.UnixMilli()
	}
	replaced := ""
	if prev != nil {
		replaced = prev.member()
	}
	vals, err := blindSinceScript.Run(ctx, s.rdb, blindKeys{Blind: s.ks.BlindKey()}, startMS, reason, scope, replaced).Int64Slice()
	if err != nil {
		return BlindInterval{}, fmt.Errorf("record blind interval: %w", err)
	}
	if len(vals) != 2 {
		return BlindInterval{}, fmt.Errorf("record blind interval: %w: %d values", errReply, len(vals))
	}
	return BlindInterval{Start: time.UnixMilli(vals[0]), End: time.UnixMilli(vals[1]), Scope: scope, Reason: reason}, nil
}

// Instance is a gateway instance's last heartbeat.
type Instance struct {
	Last  time.Time
	Lease time.Duration
}

// AliveAt reports whether the instance's lease covers now. One that left
// (no lease) is dead from its last heartbeat on. now counts in whole
// milliseconds, as the heartbeat script does: an instance judged dead has
// a heartbeat that finds the gap, and registers its users again.
func (i Instance) AliveAt(now time.Time) bool {
	return i.Lease > 0 && !now.Truncate(time.Millisecond).After(i.Last.Add(i.Lease))
}

// BeatSlack is how late a heartbeat may be before the listener counts it
// as missed: a busy host's heartbeat comes a tenth of a second late now
// and then, and a missed one holds the instance's users for the grace.
const BeatSlack = 250 * time.Millisecond

// MissedBeat reports whether the instance is dead at now, or late with
// the heartbeat it sends every third of its lease: the listener then
// holds its users' deadlines near its last heartbeat (pkg/expiry).
func (i Instance) MissedBeat(now time.Time) bool {
	return !i.AliveAt(now) || now.After(i.Last.Add(i.Lease/3+BeatSlack))
}

// SweepMark is what the listener asks of the control keys after a
// complete sweep.
type SweepMark struct {
	// GapMax is the longest time between two complete sweeps (by any
	// listener) that is not a blind interval.
	GapMax time.Duration
	// LastSeen is Redis's time at this process's previous mark, zero for
	// none: if the sweep mark is gone, Redis lost its data since then.
	LastSeen time.Time
	// Keep is how long blind intervals and dead instances are kept after
	// they end.
	Keep time.Duration
	// Listener names this replica, alive now; Failing says it cannot
	// produce now.
	Listener string
	Failing  bool
}

// Control is the state of the control keys at one sweep.
type Control struct {
	Now       time.Time
	Gap       *BlindInterval // the blind interval this mark found, if any
	Instances map[string]Instance
	Blind     []BlindInterval // those that ended within Keep
	// Listeners are the listener replicas, as they last marked.
	Listeners map[string]Listener
	// Activity is the activity feed's watermark: for each partition of
	// the activity topic, the time before which every record of it had
	// been applied. Empty when no activity consumer ever stamped.
	Activity map[int32]time.Time
	// ActivityStamp is how often the feed's members stamp the watermark,
	// as the last to stamp said: the next stamp that can move it is due
	// about one interval after the last. 0 when none said (a member that
	// predates it).
	ActivityStamp time.Duration
	// ActivityUnstamped says that a member of the activity feed started
	// (Store.ActivityFeedStarting) and none has stamped a partition yet:
	// Kafka may have been out of reach since.
	ActivityUnstamped bool
}

// ActivityWatermark is the time before which every activity record, of
// every partition, had been applied: the earliest partition's. For a feed
// that started and never stamped, it is the epoch, as for a partition not
// stamped yet: every deadline waits for the feed. ok is false when no
// activity feed ever started, or an operator forgot it.
func (c Control) ActivityWatermark() (w time.Time, ok bool) {
	for _, t := range c.Activity {
		if !ok || t.Before(w) {
			w, ok = t, true
		}
	}
	if !ok && c.ActivityUnstamped {
		return time.UnixMilli(0), true
	}
	return w, ok
}

// Listener is a listener replica's last sweep mark.
type Listener struct {
	At      time.Time
	Failing bool // it could not produce then
}

// markScript records a complete sweep and returns the control state. It
// also compares the node's run id with the one it last saw, and on a
// cluster the masters and replicas (see lua/roles.lua): a Redis that
// restarted, however quickly, lost the pings sent while it was down, and
// renewals to a master that failed over wait in clients' retries while
// their deadlines lapse. ARGV: gap max ms, last seen ms, keep ms,
// listener id, the listener's mark state ("" or listenerFailing).
var markScript = newScript[markKeys]("mark", markReasons{
	RedisRestart: BlindRestart, Failover: BlindFailover, SweepGap: BlindSweepGap, DataLost: BlindDataLost,
}, []codec{blindFormat, listenerFormat, runIDFormat, rolesFormat}, "roles")

// markReasons are the blind reasons a sweep mark records.
type markReasons struct{ RedisRestart, Failover, SweepGap, DataLost string }

// heartbeatReasons are the blind reasons a heartbeat records.
type heartbeatReasons struct{ GatewayGap, FleetDown string }

// Mark records a complete sweep, finds a blind interval since the last
// one, and reads the control state, in one round trip.
func (s *Store) Mark(ctx context.Context, m SweepMark) (Control, error) {
	script, keys, args := s.markCall(m)
	return parseControl(script.Run(ctx, s.rdb, keys, args...))
}

// markCall is markScript's call for m, as runScripts takes it, so that a
// pipeline of reads can mark after them.
func (s *Store) markCall(m SweepMark) (*redis.Script, []string, []any) {
	var last int64
	if !m.LastSeen.IsZero() {
		last = m.LastSeen.UnixMilli()
	}
	state := ""
	if m.Failing {
		state = listenerFailing
	}
	return markScript.call(markKeys{Swept: s.ks.SweptKey(), Blind: s.ks.BlindKey(), Alive: s.ks.AliveKey(),
		Listeners: s.ks.ListenersKey(), RunID: s.ks.RunIDKey(), Roles: s.ks.RolesKey(), Activity: s.ks.ActivityKey()},
		m.GapMax.Milliseconds(), last, m.Keep.Milliseconds(), m.Listener, state)
}

// parseControl reads markScript's reply.
func parseControl(cmd *redis.Cmd) (Control, error) {
	vals, err := cmd.Slice()
	if err != nil {
		return Control{}, fmt.Errorf("mark sweep: %w", err)
	}
	if len(vals) != 7 {
		return Control{}, fmt.Errorf("mark sweep: %w: %d values", errReply, len(vals))
	}
	nowMS, _ := vals[0].(int64)
	start, _ := vals[1].(int64)
	reason, _ := vals[2].(string)
	c := Control{Now: time.UnixMilli(nowMS), Instances: map[string]Instance{}, Listeners: map[string]Listener{}}
	if reason != "" {
		c.Gap = &BlindInterval{Start: time.UnixMilli(start), End: c.Now, Reason: reason}
	}
	alive, _ := vals[3].([]any)
	for i := 0; i+1 < len(alive); i += 2 {
		name, _ := alive[i].(string)
		v, _ := alive[i+1].(string)
		if inst, err := parseInstance(v); err == nil {
			c.Instances[name] = inst
		}
	}
	blind, _ := vals[4].([]any)
	for _, b := range blind {
		m, _ := b.(string)
		if bi, err := ParseBlindInterval(m); err == nil {
			c.Blind = append(c.Blind, bi)
		}
	}
	prods, _ := vals[5].([]any)
	for i := 0; i+1 < len(prods); i += 2 {
		name, _ := prods[i].(string)
		v, _ := prods[i+1].(string)
		f, ok := listenerFormat.decode(v)
		if !ok {
			continue
		}
		if ms, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			c.Listeners[name] = Listener{At: time.UnixMilli(ms), Failing: f[1] == listenerFailing}
		}
	}
	activity, _ := vals[6].([]any)
	c.Activity, c.ActivityStamp = parseActivity(activity)
	c.ActivityUnstamped = hasField(activity, activityUnstamped)
	return c, nil
}

// PruneInstances forgets gateway instances dead for longer than keep.
func (s *Store) PruneInstances(ctx context.Context, c Control, keep time.Duration) error {
	var gone []string
	for name, inst := range c.Instances {
		if c.Now.Sub(inst.Last.Add(inst.Lease)) > keep {
			gone = append(gone, name)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	return s.rdb.HDel(ctx, s.ks.AliveKey(), gone...).Err()
}

// ForgetListener removes a listener replica, as it stops.
func (s *Store) ForgetListener(ctx context.Context, id string) error {
	return s.rdb.HDel(ctx, s.ks.ListenersKey(), id).Err()
}

func parseInstance(v string) (Instance, error) {
	f, ok := aliveFormat.decode(v)
	if !ok {
		return Instance{}, fmt.Errorf("instance heartbeat %q", v)
	}
	l, err1 := strconv.ParseInt(f[0], 10, 64)
	n, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return Instance{}, fmt.Errorf("instance heartbeat %q", v)
	}
	return Instance{Last: time.UnixMilli(l), Lease: time.Duration(n) * time.Millisecond}, nil
}

// lapseScript adds n timeouts claimed to the count of the second they
// were found in, and returns the count from the window before it on.
// ARGV: n, window seconds, the first key's second, key TTL seconds.
var lapseScript = newScript[lapseKeys]("lapses", nil, nil)

// lapseAhead is how many seconds past the second the lapses were found
// in the counters a count sums reach. A count comes a while after its
// lapses were found (the batch's mark and claims come between, long in a
// stall or a storm), and another replica's share of the same crowd may
// have been counted in any second since, or into one ahead of Redis's
// clock (a mark on a node since failed over from). Summing only the
// window of a later mark, or up to now, two replicas each missed the
// other's share, and a crowd went out below the threshold twice.
const lapseAhead = 120

// LapseAhead is how long after lapses were found they can still be
// counted (Lapses).
const LapseAhead = lapseAhead * time.Second

// Lapses adds n timeouts claimed, found at at (Redis's clock), to the
// count of at's second, and returns the count from the window before it
// up to lapseAhead after it, across listener replicas: in the seconds
// after at, only what was counted by then (or ahead of Redis's clock). A
// count more than lapseAhead after at fails: it could not see every share
// counted since. token names the n lapses: they are added once, however
// often a count of them runs (a client's retry of a late reply, a caller's
// second try of a count that failed but ran).
func (s *Store) Lapses(ctx context.Context, at time.Time, window time.Duration, n int, token string) (int, error) {
	secs := max(1, int64(window/time.Second))
	first := at.Unix() - secs + 1
	keys := make([]string, 0, secs+lapseAhead)
	for sec := first; sec <= at.Unix()+lapseAhead; sec++ {
		keys = append(keys, s.ks.LapsesKey(sec))
	}
	lk := lapseKeys{Seconds: keys, Token: s.ks.LapsesTokenKey(token)}
	got, err := lapseScript.Run(ctx, s.rdb, lk, n, secs, first, secs+2*lapseAhead+1).Int()
	if err != nil {
		return 0, fmt.Errorf("count lapses: %w", err)
	}
	return got, nil
}

// Sessions counts the sessions in the deadline index: live ones and those
// whose timeouts are not settled yet.
func (s *Store) Sessions(ctx context.Context) (int64, error) {
	cmds := make([]*redis.IntCmd, Buckets)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for b := range Buckets {
			cmds[b] = p.ZCard(ctx, s.ks.IndexKey(b))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("count sessions: %w", err)
	}
	var n int64
	for _, c := range cmds {
		n += c.Val()
	}
	return n, nil
}
