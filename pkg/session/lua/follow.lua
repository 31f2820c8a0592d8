local now = redisNowMS()
local waiting, n = tonumber(ARGV[1]), 0
for j = 1, (#ARGV - 1) / 5 do
  local uid, stage, deadline = ARGV[5 * j - 3], tonumber(ARGV[5 * j - 2]), ARGV[5 * j - 1]
  local due, at = tonumber(ARGV[5 * j]), now + tonumber(ARGV[5 * j + 1])
  local nextStage = encodeStage(stage + 1, deadline)
  local cur = redis.call('HGET', KEYS[K.stage], uid)
  local score = redis.call('ZSCORE', KEYS[K.index], uid)
  local atStage = (stage == 1 and not cur) or cur == encodeStage(stage, deadline)
  if atStage and score and tonumber(score) == due and redis.call('EXISTS', KEYS[K.sessions + j - 1]) == 0 then
    redis.call('ZADD', KEYS[K.index], at, uid)
    redis.call('HSET', KEYS[K.stage], uid, nextStage)
    redis.call('HDEL', KEYS[K.held], uid)
    n = n + 1
  elseif cur == nextStage then
    if score then
      if tonumber(score) >= waiting or tonumber(score) < at then
        redis.call('ZADD', KEYS[K.index], at, uid)
        n = n + 1
      end
    else
      local held = redis.call('HGET', KEYS[K.held], uid)
      if redis.call('ZSCORE', KEYS[K.hold], uid) and held and tonumber(held) < at then
        redis.call('HSET', KEYS[K.held], uid, at)
        n = n + 1
      end
    end
  end
end
return n
