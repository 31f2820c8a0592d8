-- dropDeadRoute drops instance inst's entry from a user's route, KEYS[r]
-- with its stamps KEYS[s], if inst wrote it at or before cut (ms): inst
-- was judged dead then, and an entry it wrote since is of its return. An
-- entry without a stamp is dropped as dead. A dropped entry is remembered
-- in the stamps as "!<inst>" at now, for the listener's hold rules (see
-- due.lua's routesOf): inst's clients may still be pinging it, cut off
-- from Redis, and the user's deadline is to be held while inst is dead.
-- inst's own next write forgets it (forgetDropped), and so does any
-- write once it is older than keep ms.
local function dropDeadRoute(r, s, inst, cut, now)
  local at = tonumber(redis.call('HGET', KEYS[s], inst)) or 0
  if at > cut then return 0 end
  local n = redis.call('HDEL', KEYS[r], inst)
  redis.call('HDEL', KEYS[s], inst)
  if n == 1 then
    redis.call('HSET', KEYS[s], '!' .. inst, now)
    -- The stamps may have been created again by this very field (the
    -- drop took its last stamp): never a key without a TTL. The route
    -- key's TTL, at least, as a route write gives both.
    if redis.call('PTTL', KEYS[s]) < 0 then
      local ttl = redis.call('PTTL', KEYS[r])
      if ttl < 0 then ttl = keepDropped end
      redis.call('PEXPIRE', KEYS[s], ttl)
    end
  end
  return n
end

-- forgetDropped forgets inst's dropped entry, written by dropDeadRoute,
-- and every one older than keep ms.
local function forgetDropped(s, inst, now, keep)
  redis.call('HDEL', KEYS[s], '!' .. inst)
  local all = redis.call('HGETALL', KEYS[s])
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 1) == '!' and (tonumber(all[i + 1]) or 0) < now - keep then
      redis.call('HDEL', KEYS[s], all[i])
    end
  end
end
