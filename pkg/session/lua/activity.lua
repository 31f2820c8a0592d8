local now = redisNowMS()
local n, inst, keep, maxHold, defaultSeg = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local out, turned = {}, {}
-- The note block (see HoldNotes) of a hold an event cancels.
local note = 6
-- The policy's rules (SegmentRules), read on the first event whose TTL
-- the script resolves: after the events, their count, then segment, TTL
-- ns and clock each, then the TTL ns and clock of a segment not listed.
local rules, unlisted = nil, nil
local function rule(seg)
  if not rules then
    rules = {}
    local r = 10 + 8 * n
    local m = tonumber(ARGV[r])
    for i = 1, m do
      local b = r + 3 * (i - 1)
      rules[ARGV[b + 1]] = {tonumber(ARGV[b + 2]), ARGV[b + 3]}
    end
    unlisted = {tonumber(ARGV[r + 3 * m + 1]), ARGV[r + 3 * m + 2]}
  end
  return rules[seg] or unlisted
end
-- One user's keys at a time: the bucket's, and the event's user's below.
local k = {index = K.index, segments = K.segments, via = K.via, hold = K.hold, held = K.held, stage = K.stage}
-- The bucket's holds, held timeouts and stages, which these events only
-- remove from: one empty now stays empty, and no event reads or removes
-- its user there (the grant's k.empty). A bucket has none of them but
-- while the listener holds or stages someone of it.
k.empty = {hold = redis.call('EXISTS', KEYS[K.hold]) == 0, held = redis.call('EXISTS', KEYS[K.held]) == 0,
  stage = redis.call('EXISTS', KEYS[K.stage]) == 0}
for j = 1, n do
  local a = 9 + 8 * (j - 1)
  local uid, kind, seg, ttl, clock = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], tonumber(ARGV[a + 4]), ARGV[a + 5]
  local at, hold, jitter = tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8])
  local u = K.users + 4 * (j - 1)
  k.session, k.renewed, k.turn, k.timeline = u, u + 1, u + 2, u + 3
  -- An event of no time is of now. Its time, as sent, orders it against
  -- the user's state (a platform's clock ahead of Redis's must not
  -- reorder two events); what counts from it, a hold's end and the
  -- renewal recorded, counts from no later than now.
  local stamped = at > 0
  if not stamped then at = now end
  local from = math.min(at, now)
  -- An event of no segment is of the user's current one, else the
  -- default (an end writes none: its segment is read only for the
  -- timeline of an end that turns, below). Of no TTL, its TTL and clock
  -- are its segment's by the rules, the TTL with the event's jitter, in
  -- whole ms, as a ping's grant.
  local state = redis.call('MGET', KEYS[k.renewed], KEYS[k.turn], KEYS[k.session])
  local stored = nil
  if seg == '' and kind ~= V.ending then
    -- The live session's value says it (see grant), else the hash.
    if state[3] then stored = decodeSession(state[3]) end
    if not stored then stored = redis.call('HGET', KEYS[k.segments], uid) end
    seg = stored or defaultSeg
  end
  local ruled = ttl == 0
  if ttl == 0 and kind ~= V.ending then
    local r = rule(seg ~= '' and seg or defaultSeg)
    local ns = r[1] + jitter
    ttl, clock = (ns - ns % 1000000) / 1000000, r[2]
  end
  -- An active or a turn to the user counts the user's silence from its
  -- time: one whose silence was over before it reached us (a replayed
  -- backlog, a consumer down for an hour) is stale, and creates nothing.
  local over = from + ttl <= now
  local was = tonumber(state[1] or '0')
  local whose, since, kept = nil, 0, nil
  local turn = state[2]
  if turn then
    local w, s, _, u = decodeTurn(turn)
    if w then whose, since, kept = w, tonumber(s), tonumber(u) end
  end
  -- The turn clock's park (see grant): a wait that stands (one given up
  -- keeps 0). A wait orders by its since, as an end does.
  local waiting = whose == V.wait and (kept == nil or kept > 0)
  local applied = 1
  -- An event of its own time (at_ms) no newer than the state it would
  -- change is stale: one of the time of the user's last renewal, or of
  -- the turn in force when it passes the turn the same way, is that one
  -- sent again (a batch resent, a record applied again by its partition's
  -- next owner), and must not restart a silence guided since. Its TTL's
  -- jitter is drawn afresh each time it is applied, so whether it is over
  -- could differ. Events of no time are of now, each after the one
  -- before.
  if kind == V.active then
    -- An active of the last renewal's time is that one sent again while
    -- the silence it started lapsed (the session is gone), or while the
    -- session holds its segment and it asks for that segment's TTL; of
    -- another segment, or a TTL of its own, in a live session it is
    -- another device's word of the same ms, and its grant counts.
    local again = stamped and at == was and (not state[3] or (ruled and decodeSession(state[3]) == seg))
    if over or at < was or again or ((whose == V.ended or whose == V.wait) and at < since) then applied = 0
    else grant(k, uid, now, ttl, seg, inst, from, keep, clock, maxHold, false, false, was, turn, from, note, stored, state[3]) end
  elseif kind == V.turnUser then
    if over or at < since or (stamped and at == since and whose == V.user) then applied = 0
    else
      turn = encodeTurn(V.user, at, 0)
      redis.call('SET', KEYS[k.turn], turn)
      if whose ~= V.user then applied = 2 end
      -- The one deadline that may move earlier: a park, which only our
      -- turn or the turn clock's wait for a first turn gives, whatever
      -- the clock is now. Any other is kept: another device's longer
      -- grant. (A park of the turn clock from before the wait state was
      -- recorded has no turn state: the clock says it.)
      local parked = whose == V.us or waiting or (whose == nil and clock == V.clockTurn)
      grant(k, uid, now, ttl, seg, inst, from, keep, clock, maxHold, false, parked, was, turn, from, note, stored, state[3],
        waiting and kept or nil)
    end
  elseif kind == V.turnUs then
    -- The user's clock runs again at the hold's end, as from a turn to
    -- the user then: one that reaches us past it (a resend applied late,
    -- a backlog) counts from then, not from now, and one whose silence
    -- was over by then is stale, as for an active.
    local runs = from + hold
    if at < since or (stamped and at == since and whose == V.us) or runs + ttl <= now then applied = 0
    else
      turn = encodeTurn(V.us, at, runs)
      redis.call('SET', KEYS[k.turn], turn)
      if whose ~= V.us then applied = 2 end
      -- A turn to us after one to us replaces it: the platform's latest
      -- word on how long we may keep the user waiting, shorter or longer
      -- (an agent who picked the queued chat up is typing). The park the
      -- first gave is not kept; what the user's own activity gave is.
      -- Nor is the turn clock's wait for a first turn: the hold's end
      -- counts instead, and the grants it kept.
      grant(k, uid, now, ttl, seg, inst, from, keep, clock, maxHold, false, whose == V.us or waiting, was, turn, runs < now and runs or nil, note, stored, state[3],
        waiting and kept or nil)
    end
  elseif kind == V.ending then
    if at < was or at < since then applied = 0
    else
      if whose ~= V.ended then
        applied = 2
        if seg == '' then seg = redis.call('HGET', KEYS[k.segments], uid) or defaultSeg end
      end
      endSession(k, uid, from, keep, at, note)
    end
  else
    return redis.error_reply('unknown activity kind ' .. tostring(kind))
  end
  out[j] = applied
  -- The segment of each event that turned, in order, for its timeline.
  if applied == 2 then turned[#turned + 1] = seg end
end
return {out, turned}
