package session

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
	BlindGateway   = "gateway-gap"   // one gateway instance could not reach Redis
	BlindFleetDown = "fleet-down"    // no gateway instance was alive
	BlindRenewals  = "renewals-gap"  // a gateway's renewals failed, as it reports on recovery
	BlindRestart   = "redis-restart" // a Redis master restarted (a new run id)
	BlindFailover  = "failover"      // a Redis Cluster failover (a replica promoted, a master failed or demoted)
	BlindDrain     = "gateway-drain" // a gateway instance stopping told its clients to reconnect elsewhere
)

// heartbeatScript records that a gateway instance is alive for lease ms
// more. If it was not (a gap longer than its lease), it records the gap as
// a blind interval of that instance; if no instance was alive at all, a
// blind interval of the whole fleet from the last one seen alive.
// KEYS: alive, blind. ARGV: instance, lease ms. Returns {Redis's now,
// 1 if the instance had no heartbeat before, 1 if its last lease ran out
// before this heartbeat}.
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local inst, lease = ARGV[1], tonumber(ARGV[2])
local prev = redis.call('HGET', KEYS[1], inst)
local fresh, gap = false, 0
if prev then
  local last, plen = string.match(prev, '^(%d+):(%d+)$')
  last, plen = tonumber(last), tonumber(plen)
  if last and now > last + plen then
    redis.call('ZADD', KEYS[2], now, last .. ':' .. now .. ':gateway-gap:' .. inst)
    fresh, gap = true, 1
  end
else
  fresh = true
end
if fresh then
  local all = redis.call('HGETALL', KEYS[1])
  local newest, any = 0, false
  local alive = false
  for i = 1, #all, 2 do
    if all[i] ~= inst then
      local last, plen = string.match(all[i+1], '^(%d+):(%d+)$')
      last, plen = tonumber(last), tonumber(plen)
      if last then
        any = true
        if plen > 0 and last + plen >= now then alive = true end
        if last > newest then newest = last end
      end
    end
  end
  if any and not alive and newest < now then
    redis.call('ZADD', KEYS[2], now, newest .. ':' .. now .. ':fleet-down:')
  end
end
redis.call('HSET', KEYS[1], inst, now .. ':' .. lease)
return {now, prev and 0 or 1, gap}
`)

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
	vals, err := heartbeatScript.Run(ctx, s.rdb, []string{s.ks.AliveKey(), s.ks.BlindKey()},
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
	return strconv.FormatInt(b.Start.UnixMilli(), 10) + ":" + strconv.FormatInt(b.End.UnixMilli(), 10) +
		":" + b.Reason + ":" + b.Scope
}

// ParseBlindInterval decodes a blind interval as stored:
// "start:end:reason:scope", times in Unix ms; the scope, last, may hold
// colons.
func ParseBlindInterval(m string) (BlindInterval, error) {
	parts := strings.SplitN(m, ":", 4)
	if len(parts) != 4 {
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

// RecordBlindFor stores a blind interval that ended now, by Redis's clock,
// and lasted took, as a gateway measures an outage of its own. It returns
// the interval.
func (s *Store) RecordBlindFor(ctx context.Context, took time.Duration, scope, reason string) (BlindInterval, error) {
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return BlindInterval{}, fmt.Errorf("record blind interval: %w", err)
	}
	now = now.Truncate(time.Millisecond)
	b := BlindInterval{Start: now.Add(-took).Truncate(time.Millisecond), End: now, Scope: scope, Reason: reason}
	return b, s.RecordBlind(ctx, b)
}

// blindSinceScript records a blind interval from a start to now, by
// Redis's clock, and removes the record it replaces, in one step: an
// interval that lasts is recorded again and again, and at no moment is
// none of its records there. KEYS: blind. ARGV: start ms (0: now), reason,
// scope, the member replaced ("" for none). Returns {start, now}.
var blindSinceScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start = tonumber(ARGV[1])
if start <= 0 or start > now then start = now end
local m = start .. ':' .. now .. ':' .. ARGV[2] .. ':' .. ARGV[3]
redis.call('ZADD', KEYS[1], now, m)
if ARGV[4] ~= '' and ARGV[4] ~= m then redis.call('ZREM', KEYS[1], ARGV[4]) end
return {start, now}
`)

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
	vals, err := blindSinceScript.Run(ctx, s.rdb, []string{s.ks.BlindKey()}, startMS, reason, scope, replaced).Int64Slice()
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
}

// Listener is a listener replica's last sweep mark.
type Listener struct {
	At      time.Time
	Failing bool // it could not produce then
}

// clusterRolesLua decides, in the sweep mark, whether a Redis Cluster
// failed over since the last mark, from which nodes are masters and which
// replicas, not from the cluster's epoch: moving a slot to another master
// (CLUSTER SETSLOT ... NODE, every step of a reshard or a rebalance) bumps
// the epoch without consensus while no node failed and no renewal waited,
// and a failover taken from it would hold every deadline for the grace.
//
// roles reads CLUSTER NODES into node id -> role: 'M' a master serving
// slots, 'm' a master serving none, 'r' a replica, 'f' a node marked
// failed. encodeRoles and decodeRoles store it sorted, as "id:R,...".
// failedOver is the rule: a replica that serves slots as a master now
// (promoted), or a master that served slots and is now failed, a replica,
// or gone from the cluster. A slot moved between masters, a master added
// or drained and removed, a replica added or moved: none of them is a
// failover.
const clusterRolesLua = `
local function roles(nodes)
  local out = {}
  for line in string.gmatch(nodes, '[^\r\n]+') do
    local f = {}
    for w in string.gmatch(line, '%S+') do f[#f + 1] = w end
    local flags = ',' .. (f[3] or '') .. ','
    if #f >= 8 and not string.find(flags, ',handshake,', 1, true) then
      local role = 'r'
      if string.find(flags, ',fail,', 1, true) then
        role = 'f'
      elseif string.find(flags, ',master,', 1, true) then
        role = 'm'
        -- Slots from the ninth field; a slot being imported or migrated
        -- ('[...]') is not served yet, or still.
        for i = 9, #f do
          if string.sub(f[i], 1, 1) ~= '[' then role = 'M' break end
        end
      end
      out[f[1]] = role
    end
  end
  return out
end
local function encodeRoles(r)
  local out = {}
  for id, role in pairs(r) do out[#out + 1] = id .. ':' .. role end
  table.sort(out)
  return table.concat(out, ',')
end
local function decodeRoles(s)
  local out = {}
  for id, role in string.gmatch(s or '', '(%x+):(%a)') do out[id] = role end
  return out
end
local function failedOver(prev, cur)
  for id, was in pairs(prev) do
    local now = cur[id]
    if was == 'r' and now == 'M' then return true end
    if was == 'M' and now ~= 'M' and now ~= 'm' then return true end
  end
  return false
end
`

// markScript records a complete sweep and returns the control state. It
// also compares the node's run id with the one it last saw, and on a
// cluster the masters and replicas (see clusterRolesLua): a Redis that
// restarted, however quickly, lost the pings sent while it was down, and
// renewals to a master that failed over wait in clients' retries while
// their deadlines lapse. KEYS: swept, blind, alive, listeners, run id,
// roles. ARGV: gap max ms, last seen ms, keep ms, listener id, listener
// failing (0/1).
var markScript = redis.NewScript(markLua)

const markLua = clusterRolesLua + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gapMax, lastSeen, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local rid = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
-- On a cluster, the nodes' roles, as this node sees them: until a failed
-- master's users' renewals find the promoted replica, their deadlines
-- lapse under them. They have a key of their own: the run id key holds
-- '<run id>/<epoch>', as a listener of the release before wrote it and
-- still reads it, taking any change of it for a failover; with the
-- roles in it, each of its marks during a rolling upgrade was one.
local cur, failover = nil, false
local cok, cnodes = pcall(redis.call, 'CLUSTER', 'NODES')
if cok then
  cur = roles(cnodes)
  local iok, cinfo = pcall(redis.call, 'CLUSTER', 'INFO')
  rid = rid .. '/' .. ((iok and string.match(cinfo, 'cluster_current_epoch:(%d+)')) or '')
  local enc = encodeRoles(cur)
  local proles = redis.call('GET', KEYS[6])
  if proles ~= enc then redis.call('SET', KEYS[6], enc) end
  -- None stored (the first mark of this release): no failover found.
  failover = proles and failedOver(decodeRoles(proles), cur)
end
local prid = redis.call('GET', KEYS[5])
if prid ~= rid then redis.call('SET', KEYS[5], rid) end
local restarted = prid and string.match(prid, '^(%x*)') ~= string.match(rid, '^(%x*)')
local prev = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], now)
local start, reason = 0, ''
if prev then
  prev = tonumber(prev)
  if restarted then start, reason = prev, 'redis-restart'
  elseif failover then start, reason = prev, 'failover'
  elseif now - prev > gapMax then start, reason = prev, 'sweep-gap' end
elseif lastSeen > 0 then
  start, reason = lastSeen, 'data-lost'
end
if reason ~= '' then
  redis.call('ZADD', KEYS[2], now, start .. ':' .. now .. ':' .. reason .. ':')
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - keep)
if ARGV[4] ~= '' then
  local v = now
  if ARGV[5] == '1' then v = now .. ':failing' end
  redis.call('HSET', KEYS[4], ARGV[4], v)
end
return {now, start, reason, redis.call('HGETALL', KEYS[3]),
  redis.call('ZRANGE', KEYS[2], now - keep, '+inf', 'BYSCORE'), redis.call('HGETALL', KEYS[4])}
`

// Mark records a complete sweep, finds a blind interval since the last
// one, and reads the control state, in one round trip.
func (s *Store) Mark(ctx context.Context, m SweepMark) (Control, error) {
	var last int64
	if !m.LastSeen.IsZero() {
		last = m.LastSeen.UnixMilli()
	}
	failing := 0
	if m.Failing {
		failing = 1
	}
	vals, err := markScript.Run(ctx, s.rdb,
		[]string{s.ks.SweptKey(), s.ks.BlindKey(), s.ks.AliveKey(), s.ks.ListenersKey(), s.ks.RunIDKey(), s.ks.RolesKey()},
		m.GapMax.Milliseconds(), last, m.Keep.Milliseconds(), m.Listener, failing).Slice()
	if err != nil {
		return Control{}, fmt.Errorf("mark sweep: %w", err)
	}
	if len(vals) != 6 {
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
		at, failing := strings.CutSuffix(v, ":failing")
		if ms, err := strconv.ParseInt(at, 10, 64); err == nil {
			c.Listeners[name] = Listener{At: time.UnixMilli(ms), Failing: failing}
		}
	}
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
	last, lease, ok := strings.Cut(v, ":")
	if !ok {
		return Instance{}, fmt.Errorf("instance heartbeat %q", v)
	}
	l, err1 := strconv.ParseInt(last, 10, 64)
	n, err2 := strconv.ParseInt(lease, 10, 64)
	if err1 != nil || err2 != nil {
		return Instance{}, fmt.Errorf("instance heartbeat %q", v)
	}
	return Instance{Last: time.UnixMilli(l), Lease: time.Duration(n) * time.Millisecond}, nil
}

// lapseScript counts n timeouts claimed in second ARGV[1] and returns the
// count of the window. KEYS: the window's lapse keys, the current second
// last. ARGV: n, key TTL seconds.
var lapseScript = redis.NewScript(`
local n = tonumber(ARGV[1])
if n > 0 then
  redis.call('INCRBY', KEYS[#KEYS], n)
  redis.call('EXPIRE', KEYS[#KEYS], tonumber(ARGV[2]))
end
local sum = 0
for i = 1, #KEYS do sum = sum + (tonumber(redis.call('GET', KEYS[i])) or 0) end
return sum
`)

// Lapses adds n timeouts claimed at now (Redis's clock) to the count of
// the last window, and returns that count, across listener replicas.
func (s *Store) Lapses(ctx context.Context, now time.Time, window time.Duration, n int) (int, error) {
	secs := max(1, int64(window/time.Second))
	cur := now.Unix()
	keys := make([]string, 0, secs)
	for sec := cur - secs + 1; sec <= cur; sec++ {
		keys = append(keys, s.ks.LapsesKey(sec))
	}
	got, err := lapseScript.Run(ctx, s.rdb, keys, n, secs+1).Int()
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
