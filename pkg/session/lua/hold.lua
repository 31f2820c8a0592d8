local held = {}
for j = 1, #ARGV / 3 do
  local uid = ARGV[3 * j - 2]
  local score = redis.call('ZSCORE', KEYS[K.index], uid)
  if score and tonumber(score) == tonumber(ARGV[3 * j - 1]) and redis.call('EXISTS', KEYS[K.sessions + j - 1]) == 0 then
    redis.call('ZREM', KEYS[K.index], uid)
    redis.call('ZADD', KEYS[K.hold], ARGV[3 * j], uid)
    redis.call('HSET', KEYS[K.held], uid, ARGV[3 * j - 1])
    held[#held+1] = uid
  end
end
return held
