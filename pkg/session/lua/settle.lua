local n = 0
for j = 1, #ARGV / 4 do
  local uid = ARGV[4 * j - 3]
  local score = redis.call('ZSCORE', KEYS[K.index], uid)
  if score and tonumber(score) == tonumber(ARGV[4 * j - 2]) then
    local nxt = tonumber(ARGV[4 * j - 1])
    if nxt > 0 then
      redis.call('ZADD', KEYS[K.index], nxt, uid)
      redis.call('HSET', KEYS[K.stage], uid, ARGV[4 * j])
      redis.call('HDEL', KEYS[K.held], uid)
    else
      redis.call('ZREM', KEYS[K.index], uid)
      redis.call('HDEL', KEYS[K.stage], uid)
      if redis.call('EXISTS', KEYS[K.sessions + j - 1]) == 0 then
        redis.call('HDEL', KEYS[K.segments], uid)
        redis.call('HDEL', KEYS[K.via], uid)
        redis.call('HDEL', KEYS[K.held], uid)
      end
    end
    n = n + 1
  end
end
return n
