local now = redisNowMS()
local ttl = tonumber(ARGV[2])
local uid = ARGV[1]
local at = now - (tonumber(ARGV[7]) or 0)
local was = tonumber(redis.call('GET', KEYS[K.renewed]) or '0')
-- Between stages the index holds when the next stage is due, not a
-- deadline: the silence is past, and a ping ends it.
local cur = nil
if redis.call('HEXISTS', KEYS[K.stage], uid) == 0 then
  cur = tonumber(redis.call('ZSCORE', KEYS[K.index], uid) or redis.call('HGET', KEYS[K.held], uid))
end
if ARGV[5] == V.resync then
  if cur and cur >= now + ttl then return {cur, now + ttl} end
  if ttl <= 0 then return {now + ttl, now + ttl} end
  -- A renewal or an end Redis knows of since the ping is newer than it.
  if was > at then return {cur or 0, now + ttl} end
end
local deadline, seg, via = now + ttl, ARGV[3], ARGV[4]
if cur and cur > deadline then
  deadline = cur
  seg = redis.call('HGET', KEYS[K.segments], uid) or seg
  -- The via names the instance of the grant the deadline is, then this
  -- one, the last to renew: an outage of either may hold the deadline.
  local granter = decodeVia(redis.call('HGET', KEYS[K.via], uid) or '')
  if via ~= '' and granter ~= '' and granter ~= via then via = encodeVia(granter, via) end
end
redis.call('SET', KEYS[K.session], seg, 'PX', deadline - now)
redis.call('ZADD', KEYS[K.index], deadline, uid)
redis.call('HSET', KEYS[K.segments], uid, seg)
if via ~= '' then redis.call('HSET', KEYS[K.via], uid, via) end
redis.call('ZREM', KEYS[K.hold], uid)
redis.call('HDEL', KEYS[K.held], uid)
redis.call('HDEL', KEYS[K.stage], uid)
if at > was then
  redis.call('SET', KEYS[K.renewed], at, 'PX', deadline - now + tonumber(ARGV[6]))
end
return {deadline, now + ttl}
