local now = redisNowMS()
local limit, nheld, laterOnly, report = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3] == '1', ARGV[4] == '1'
local notDue = {}
local out, n = {now, notDue}, 0
for j = 1, #ARGV - 4 do
  local uid = ARGV[j + 4]
  -- A release read the index score and the held due time already: a
  -- held timeout in a storm is asked once, and each call costs.
  local released, score, held = false, nil, nil
  if j <= nheld then
    local r = redis.call('ZSCORE', KEYS[K.hold], uid)
    if r and tonumber(r) <= now then
      redis.call('ZREM', KEYS[K.hold], uid)
      held = redis.call('HGET', KEYS[K.held], uid)
      score = redis.call('ZSCORE', KEYS[K.index], uid)
      if held and not score then
        redis.call('ZADD', KEYS[K.index], held, uid)
        score = held
      end
      released = true
    end
  end
  if not released then score = redis.call('ZSCORE', KEYS[K.index], uid) end
  local stage = redis.call('HGET', KEYS[K.stage], uid) or ''
  if n < limit and score and tonumber(score) <= now and (j <= nheld or not laterOnly or stage ~= '')
      and redis.call('EXISTS', KEYS[K.entries + 3 * j - 3]) == 0 then
    if not released then held = redis.call('HGET', KEYS[K.held], uid) end
    out[#out+1] = uid
    out[#out+1] = score
    out[#out+1] = redis.call('HGET', KEYS[K.segments], uid) or ''
    out[#out+1] = redis.call('HGET', KEYS[K.via], uid) or ''
    out[#out+1] = (held and tonumber(held) == tonumber(score)) and 1 or 0
    out[#out+1] = routesOf(K.entries + 3 * j - 2, K.entries + 3 * j - 1)
    out[#out+1] = stage
    n = n + 1
  elseif report then
    -- Where it is now, so that a timer fired too soon, or before a
    -- renewal, can be set again: its index score, or its release time
    -- when it is held.
    notDue[#notDue+1] = uid
    notDue[#notDue+1] = score or ''
    notDue[#notDue+1] = redis.call('ZSCORE', KEYS[K.hold], uid) or ''
    notDue[#notDue+1] = stage ~= '' and 1 or 0
  end
end
return out
