-- The grant of a session, with the turn state that may park it, shared
-- by renew.lua and activity.lua; and the end of a session, shared by
-- end.lua and activity.lua. k names the KEYS index of each of one user's
-- keys: session, renewed, turn, timeline, and the bucket's index,
-- segments, via, hold, held and stage (K itself, for a script of one
-- user). Both cancel a hold on the user's timeout, and note is the ARGV
-- index of the note block that says so in the user's timeline
-- (holdCancelled, lua/holdnote.lua), or nil to record nothing. k.empty,
-- when set, says which of the bucket's hold, held and stage keys the
-- caller found empty: neither adds to them, so one empty stays so for
-- the caller's whole call, and its reads and removals are skipped.

-- none is k.empty for a caller that did not look.
local none = {}

-- heldUntil is when the user's clock starts to run, if that is after
-- now: while it is our turn, until the turn's max hold; on the turn
-- clock, until the first turn to the user (at most maxHold from now),
-- and then waits is true. nil while the clock runs.
local function heldUntil(turn, clock, now, maxHold)
  local whose, til = nil, nil
  if turn then
    local w, _, u = decodeTurn(turn)
    whose, til = w, tonumber(u)
  end
  if whose == V.us then
    if til > now then return til, false end
    return nil, false
  end
  if whose == V.user then return nil, false end
  if clock == V.clockTurn then return now + maxHold, true end
  return nil, false
end

-- grant renews a session as renewScript says (store.go). While the
-- clock is held (heldUntil), the deadline is parked: the hold's end plus
-- ttl, never found due before it. With unpark, the deadline written is
-- not kept: it may be a park, which a turn to the user ends. resync is
-- false, or renewScript's mode V.resync or V.lapsed; at its ping time. was and turn are the renewed
-- and turn keys' values when the caller read them already (turn false
-- when there is none), else nil. from is when the ttl counts from, at
-- most now, nil for now: an activity event's time, so that one that
-- reaches us late does not start a silence late; the caller makes sure
-- from+ttl is after now. stored is the user's segment in the segments
-- hash when the caller read it already (false when there is none), else
-- nil: a segment written unchanged is not written again. sess is the
-- session key's value when the caller read it with was and turn (false
-- when there is none), else nil. floor, with unpark, is the latest
-- deadline the user's activity gave unheld while the park stood (the
-- park state the caller replaced), or nil. Returns {the session's
-- deadline, this grant's own: from+ttl}.
local function grant(k, uid, now, ttl, seg, via, at, keep, clock, maxHold, resync, unpark, was, turn, from, note, stored, sess, floor)
  if was == nil and turn == nil then
    local state = redis.call('MGET', KEYS[k.renewed], KEYS[k.turn], KEYS[k.session])
    was, turn, sess = tonumber(state[1] or '0'), state[2], state[3]
  end
  -- While the session key lives, its value says what the bucket's
  -- segments and via hashes hold for the user (sessionFormat: only this
  -- function writes the key, and writes them with it; whatever removes
  -- their entries removes the key, or finds it gone): the segment read
  -- without a call, and each written only when it changes. A via of ''
  -- is not known (a value written before it carried one, or by a grant
  -- of no instance), and never spares a write.
  local knownVia = ''
  if sess then
    local s, v = decodeSession(sess)
    if s then
      if stored == nil then stored = s end
      knownVia = v
    end
  end
  if was == nil then was = tonumber(redis.call('GET', KEYS[k.renewed]) or '0') end
  if turn == nil then turn = redis.call('GET', KEYS[k.turn]) end
  local empty = k.empty or none
  -- The turn clock's park until a first turn to the user: a wait state
  -- (see turnFormat), since the state it replaced, and, as this release
  -- writes it, the latest deadline the user's activity gave unheld while
  -- it stands (kept: another device's longer grant, which the park's own
  -- deadline hides in the index), 0 once given up. The park holds while
  -- the user's latest activity is on the turn clock: a grant on the
  -- presence clock (the segment switched to it, or a device of another
  -- segment) gives it up, as a turn to the user does, for what the
  -- user's activity gives unheld, on any device; the state stays, for its
  -- since, and parks again on the turn clock's next grant. A lapsed grant
  -- of an outage gives it up only if it restores its silence (below).
  local whose, since0, parked = nil, 0, false
  if turn then
    local w, s0, _, kept0 = decodeTurn(turn)
    whose, since0 = w, tonumber(s0) or 0
    kept0 = tonumber(kept0)
    parked = w == V.wait and (kept0 == nil or kept0 > 0)
    if parked and kept0 and not unpark then floor = kept0 end
  end
  if parked and not unpark and resync ~= V.lapsed and clock ~= V.clockTurn then unpark = true end
  -- The user's stage entry, read once: whether they are between stages
  -- (below), and the stages a note says were cancelled (at the end).
  local stv = false
  if (not unpark or note) and not empty.stage then stv = redis.call('HGET', KEYS[k.stage], uid) end
  -- Between stages the index holds when the next stage is due, not a
  -- deadline: the silence is past, and a ping ends it.
  local staged = not unpark and stv ~= false
  local cur = nil
  if not unpark and not staged then
    cur = tonumber(redis.call('ZSCORE', KEYS[k.index], uid) or (not empty.held and redis.call('HGET', KEYS[k.held], uid)))
  end
  if resync == V.lapsed then
    -- A grant that ran out while Redis was out of reach: its silence fell
    -- in the outage, and is guided once, after the grace, unless it may
    -- have been handled already. So it is restored, at its own deadline
    -- (past, in the blind interval the gateway recorded first: the listener
    -- holds it until the grace is over), only while its timeout is still
    -- pending (cur: an index entry that is not a stage, or a held
    -- timeout, which the held hash keeps until settled), or when Redis
    -- knows nothing of the user (no renewed key: the data was lost, or the
    -- renewal never landed), or between the stages of a silence whose
    -- deadline the ping came after (ended: the user came back after it
    -- was guided, and their ping's own silence fell in the outage). Never
    -- between the stages of a silence the ping is older than (it is this
    -- grant's silence, or a later one: guided), nor when Redis knows a
    -- renewal or end as new as the ping; otherwise, with a renewal
    -- recorded and no timeout pending, the silence was guided or ended
    -- already, and nothing is restored.
    local after = false
    if staged then
      local silence = tonumber(string.match(stv or '', ':(%d+)$'))
      after = silence ~= nil and at > silence
    end
    if (staged and not after) or was >= at or not (cur or after or was == 0) then return {cur or 0, now} end
    -- At its own deadline (ttl: what was left of it, ran out that long
    -- ago), which the guide names: past, so found due at once; it ran out
    -- in the outage, whose blind interval holds it.
    ttl = math.min(ttl, 0)
    -- A standing wait of the turn clock that this ping, on the presence
    -- clock and the user's latest activity, gave up while Redis was out
    -- of reach: given up now, the silence restored at its own deadline,
    -- or the grants the wait kept.
    if parked and not staged and clock ~= V.clockTurn then unpark, cur = true, nil end
  end
  if resync then
    if cur and cur >= now + math.max(ttl, 1) then return {cur, now + ttl} end
    if ttl <= 0 and resync ~= V.lapsed then return {now + ttl, now + ttl} end
    -- A renewal or an end Redis knows of since the ping is newer than it,
    -- unless a timeout is pending: then this grant may be the later one
    -- (another device's, of a longer TTL), and the later deadline stays.
    if was > at and not cur then return {cur or 0, now + ttl} end
  end
  local own = (from or now) + ttl
  local deadline = own
  -- A user between the stages of a silence had the turn, or no silence
  -- would have counted on the turn clock. Their turn state is kept only
  -- as long as a renewal is remembered past the deadline, and a stage may
  -- come a day after the one before: one found gone is written again as
  -- theirs (since unknown), so that their ping is not parked as a first
  -- one's.
  if staged and clock == V.clockTurn and (not turn or whose == V.wait) then
    -- So is one whose wait lapsed at its max hold: the clock ran since.
    turn = encodeTurn(V.user, since0, 0)
    redis.call('SET', KEYS[k.turn], turn, 'KEEPTTL')
    whose, parked = V.user, false
  end
  local held, waits = heldUntil(turn, clock, now, maxHold)
  -- The latest activity decides whether the turn clock's wait holds: a
  -- resync of a ping older than a renewal Redis knows of parks nothing.
  if waits and resync and was > at then held, waits = nil, false end
  if held then deadline = held + ttl end
  -- A park given up is given up for what the user's last activity, on
  -- any device, gives unheld: a turn that ends ours never guides sooner
  -- than a TTL after the user's last ping, nor before a longer grant of
  -- another device that the park hid (floor).
  if unpark and not held and was + ttl > deadline then deadline = was + ttl end
  if unpark and floor and floor > deadline then deadline = floor end
  if waits or (parked and not unpark) then
    -- The park is recorded, for a turn to the user to end whatever the
    -- clock is by then; it keeps the since of the state it replaces, and
    -- the latest deadline the user's activity gave unheld: before the
    -- first park, the deadline it hides (another device's grant).
    local kept = math.max(floor or 0, own)
    if not parked and cur and cur > kept then kept = cur end
    local parkEnd = held
    if not parkEnd then
      local _, _, u = decodeTurn(turn)
      parkEnd = tonumber(u) or 0
    end
    turn = encodeTurn(V.wait, since0, parkEnd, kept)
    redis.call('SET', KEYS[k.turn], turn, 'KEEPTTL')
  elseif parked and unpark then
    -- Given up: no park stands (0 kept), and the state keeps its since,
    -- an end's that an event older than it must not pass.
    turn = encodeTurn(V.wait, since0, 0, 0)
    redis.call('SET', KEYS[k.turn], turn, 'KEEPTTL')
  end
  if cur and cur > deadline then
    deadline = cur
    if stored == nil then stored = redis.call('HGET', KEYS[k.segments], uid) end
    seg = stored or seg
    -- The via names the instance of the grant the deadline is, then this
    -- one, the last to renew: an outage of either may hold the deadline.
    -- The live session's value says what the via hash holds, when known.
    local granter = decodeVia(knownVia ~= '' and knownVia or redis.call('HGET', KEYS[k.via], uid) or '')
    if via ~= '' and granter ~= '' and granter ~= via then via = encodeVia(granter, via) end
  end
  if via ~= '' and via ~= knownVia then
    redis.call('HSET', KEYS[k.via], uid, via)
    knownVia = via
  end
  redis.call('SET', KEYS[k.session], encodeSession(seg, knownVia), 'PX', ms(math.max(deadline - now, 1)))
  redis.call('ZADD', KEYS[k.index], ms(deadline), uid)
  if seg ~= stored then redis.call('HSET', KEYS[k.segments], uid, seg) end
  if not empty.hold and redis.call('ZREM', KEYS[k.hold], uid) == 1 and note and resync ~= V.lapsed then holdCancelled(k, note, holdNoteRenewed) end
  if not empty.held then redis.call('HDEL', KEYS[k.held], uid) end
  -- Between stages: the stages left of the silence are cancelled. Said
  -- in the user's timeline when there is a note block.
  local st = note and stv
  if st then stagesCancelled(k, note, st) end
  if (st or not note) and not empty.stage then redis.call('HDEL', KEYS[k.stage], uid) end
  -- Kept for keep past the deadline, or past now for one restored at a
  -- deadline long past (a lapsed grant of a long outage).
  local kept = math.max(deadline, now) - now + keep
  -- The turn state is kept at least as long as it was (the writes above
  -- keep its expiry): an end, or a wait that took its time, is remembered
  -- as long as the end set (see activityKeep). A grant after it (a ping
  -- of a device whose segment has a shorter TTL) must not shorten that,
  -- or an event older than the end would apply once it is forgotten.
  if turn then kept = math.max(kept, tonumber(redis.call('PTTL', KEYS[k.turn])) or 0) end
  if at > was then
    redis.call('SET', KEYS[k.renewed], ms(at), 'PX', ms(kept))
  end
  if turn then redis.call('PEXPIRE', KEYS[k.turn], ms(kept)) end
  return {deadline, own}
end

-- endSession removes a session and records the end, at at, as the
-- user's last renewal. ended is the time of the platform's end of the
-- conversation, or nil: with it, the turn state becomes "ended" since
-- then, for keep, so that an event older than the end is stale. Without
-- it (a WebSocket's last close: a chat window closed, not the
-- conversation) the turn state is kept, to expire on its own.
--
-- Neither is kept shorter than it was: the grants before the end kept
-- them as long as an event they applied could apply again (a turn to us
-- held a day, an active of a long TTL of its own), and such an event,
-- older than the end, must find the end until then.
local function endSession(k, uid, at, keep, ended, note)
  keep = math.max(keep, tonumber(redis.call('PTTL', KEYS[k.renewed])) or 0, tonumber(redis.call('PTTL', KEYS[k.turn])) or 0)
  redis.call('SET', KEYS[k.renewed], at, 'PX', keep)
  redis.call('DEL', KEYS[k.session])
  if ended then
    redis.call('SET', KEYS[k.turn], encodeTurn(V.ended, ended, 0), 'PX', keep)
  else
    -- The grants a wait kept were the session's, and went with it: the
    -- wait stays, for its since, given up.
    local turn = redis.call('GET', KEYS[k.turn])
    if turn then
      local w, s0, _, kept0 = decodeTurn(turn)
      if w == V.wait and (tonumber(kept0) or 0) > 0 then
        redis.call('SET', KEYS[k.turn], encodeTurn(V.wait, s0, 0, 0), 'KEEPTTL')
      end
    end
  end
  redis.call('ZREM', KEYS[k.index], uid)
  redis.call('HDEL', KEYS[k.segments], uid)
  redis.call('HDEL', KEYS[k.via], uid)
  local empty = k.empty or none
  if not empty.hold and redis.call('ZREM', KEYS[k.hold], uid) == 1 and note then holdCancelled(k, note, holdNoteEnded) end
  if not empty.held then redis.call('HDEL', KEYS[k.held], uid) end
  if not empty.stage then redis.call('HDEL', KEYS[k.stage], uid) end
end
